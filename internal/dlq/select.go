package dlq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// An operator's retry — of one letter or of a batch, dry run or not —
// decides letter by letter with one function, RetrySelected, which runs the
// same Lua predicate in both modes; a dry run only leaves out the requeue.
// So a dry run over a set of letters says exactly what the real run does
// on them when nothing changes in between, and a letter the real run
// refuses was refused by the dry run too.

// Verdict is what an operator's retry does with one letter.
type Verdict int

// Verdicts of RetrySelected.
const (
	// VerdictRetry: requeued due now (dry run: would be).
	VerdictRetry Verdict = iota
	// VerdictGone: the index does not hold the letter (purged, expired).
	VerdictGone
	// VerdictNotRetryable: its reason's row says no retry can fix it
	// (invalid_message, handler_rejected) and the retry did not include
	// those.
	VerdictNotRetryable
	// VerdictSettled: retried already (the retry is on the main topic) or
	// done: a letter is never selected again once re-injected, until its
	// message fails again and updates it.
	VerdictSettled
	// VerdictBusy: due now, requeued by another batch, or claimed by a
	// scheduler that is re-injecting it: it goes anyway, and a second
	// requeue would send it twice.
	VerdictBusy
	// VerdictActed: requeued by this batch already (a batch resumed after
	// its runner died); counted as acted, not requeued again.
	VerdictActed
)

func (v Verdict) String() string {
	switch v {
	case VerdictRetry:
		return "retry"
	case VerdictGone:
		return "gone"
	case VerdictNotRetryable:
		return "not_retryable"
	case VerdictSettled:
		return "settled"
	case VerdictBusy:
		return "busy"
	case VerdictActed:
		return "acted"
	}
	return "unknown"
}

// Explain says in words why a letter was not retried.
func (v Verdict) Explain() string {
	switch v {
	case VerdictGone:
		return "not in the DLQ index (purged or expired)"
	case VerdictNotRetryable:
		return "its reason is never retried automatically (no retry can fix it): include non-retryable reasons to retry it anyway"
	case VerdictSettled:
		return "already retried (or its message is done): it is not retried again unless it fails again"
	case VerdictBusy:
		return "due now or being re-injected by the scheduler: it goes anyway"
	}
	return v.String()
}

// RetryRequest is an operator's retry of letters.
type RetryRequest struct {
	// DryRun decides and changes nothing.
	DryRun bool
	// IncludeNotRetryable retries letters whose reason no retry can fix
	// (the reason table's non-recoverable rows: invalid_message,
	// handler_rejected);
	// without it they are VerdictNotRetryable.
	IncludeNotRetryable bool
	// Batch names the operator batch acting (kept on each letter it
	// requeues, so a resumed batch does not count a letter twice); "" for
	// a single letter.
	Batch string
	// At is the first requeued letter's due time; each further one is due
	// a millisecond later, in the order of ids.
	At time.Time
}

// retryScript is the one selection of an operator's retry: per ID, the
// verdict (VerdictRetry … VerdictActed) and the letter's attempts, and
// unless the run is dry it requeues the VerdictRetry ones. ARGV: prefix,
// now_ms, dry (1/0), batch, include (1/0), never (",r1,r2,"), at_ms, ids.
var retryScript = redis.NewScript(`
local p, now, dry, batch, incl, never = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local at = tonumber(ARGV[7])
local out = {}
for i = 8, #ARGV do
  local id = ARGV[i]
  local mk = p .. 'msg:' .. id
  local h = redis.call('HMGET', mk, 's', 'r', 'a', 'l', 'b')
  local v = 0
  if not h[1] then
    v = 1
  elseif batch ~= '' and h[5] == batch then
    v = 5
  elseif h[1] == 'retried' or h[1] == 'done' then
    v = 3
  elseif incl ~= '1' and string.find(never, ',' .. h[2] .. ',', 1, true) then
    v = 2
  elseif tonumber(h[4] or '0') > now then
    v = 4
  elseif h[1] == 'due' and h[5] and h[5] ~= '' then
    v = 4
  elseif h[1] == 'due' and tonumber(redis.call('ZSCORE', p .. 'due', id) or '0') <= now then
    v = 4
  end
  if v == 0 and dry ~= '1' then
    redis.call('ZREM', p .. 'review', id)
    redis.call('ZADD', p .. 'due', at, id)
    redis.call('HSET', mk, 's', 'due')
    if batch ~= '' then redis.call('HSET', mk, 'b', batch) else redis.call('HDEL', mk, 'b') end
    at = at + 1
  end
  out[#out + 1] = v
  out[#out + 1] = tonumber(h[3] or '0')
end
return out
`)

// neverReasons lists the reason table's non-recoverable reasons in the
// form retryScript reads (",r1,r2,").
func neverReasons() string {
	var b strings.Builder
	b.WriteByte(',')
	for _, r := range deadletter.Rows() {
		if !r.Recoverable {
			b.WriteString(string(r.Reason))
			b.WriteByte(',')
		}
	}
	return b.String()
}

// Retryable reports whether an operator's retry of letters of reason r
// needs RetryRequest.IncludeNotRetryable (the reason table's recoverable
// column; a reason the table lacks is retryable).
func Retryable(r Reason) bool { return deadletter.IsRecoverable(r) }

// RetrySelected is the one selection of an operator's retry, for one
// letter and for a batch, dry run or not: it decides for each ID what the
// retry does (see Verdict) and, unless req.DryRun, requeues the
// VerdictRetry ones due from req.At on in the order of ids, recording each
// move in the DLQ topic (with an event sink). Decisions and requeues are
// one Lua script per call, so no scheduler claim or other batch slips in
// between; a letter is requeued by at most one of two concurrent calls.
func (x *Index) RetrySelected(ctx context.Context, ids []string, req RetryRequest) ([]Verdict, error) {
	out := make([]Verdict, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	dry, incl := "0", "0"
	if req.DryRun {
		dry = "1"
	}
	if req.IncludeNotRetryable {
		incl = "1"
	}
	at := req.At
	if at.IsZero() {
		at = x.clock.Now()
	}
	args := make([]any, 0, len(ids)+7)
	args = append(args, x.base, x.clock.Now().UnixMilli(), dry, req.Batch, incl, neverReasons(), at.UnixMilli())
	for _, id := range ids {
		args = append(args, id)
	}
	vals, err := retryScript.Run(ctx, x.rdb, []string{x.key("due")}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("dlq retry selection: %w", err)
	}
	k := 0
	for i := range ids {
		if 2*i+1 >= len(vals) {
			return nil, fmt.Errorf("dlq retry selection: %d answers for %d letters", len(vals)/2, len(ids))
		}
		code, _ := vals[2*i].(int64)
		attempts, _ := strconv.Atoi(fmt.Sprint(vals[2*i+1]))
		v := []Verdict{VerdictRetry, VerdictGone, VerdictNotRetryable, VerdictSettled, VerdictBusy, VerdictActed}[min(max(code, 0), 5)]
		out[i] = v
		if v == VerdictRetry && !req.DryRun {
			x.recordMove(ctx, ids[i], false, at.Add(time.Duration(k)*time.Millisecond), attempts)
			k++
		}
	}
	return out, nil
}

// MarkDone records that the messages of these retried letters are done
// (their retries were processed): each goes from retried to done, in the
// index and, with an event sink, in the DLQ topic (EventDone). A letter
// in another state is left as it is. It returns how many it marked.
func (x *Index) MarkDone(ctx context.Context, es []*Entry) (int, error) {
	n := 0
	for _, e := range es {
		if e == nil || e.State != StateRetried {
			continue
		}
		ev := &chatmsg.DeadLetter{ID: e.ID, Event: EventDone, Reason: e.Reason, UserID: e.UserID,
			OriginalKey: e.OriginalKey, FailureTime: x.clock.Now()}
		res, err := x.applyAt(ctx, ev, Coord{}, 0)
		if err != nil {
			return n, err
		}
		if res != IndexEvent {
			continue
		}
		n++
		e.State = StateDone
		if x.events != nil {
			if err := x.eventKey(ctx, e); err == nil {
				ev.OriginalKey = e.OriginalKey
			}
			x.sendEvent(ev)
		}
	}
	return n, nil
}

// Unsettled returns up to limit retried letters not known done, last
// looked at before `before` (oldest first), and marks them looked at now:
// the dlq-consumer asks the dedup store about them and marks the done ones
// (MarkDone), so a letter says when its message is done.
func (x *Index) Unsettled(ctx context.Context, before time.Time, limit int) ([]*Entry, error) {
	ids, err := x.rdb.ZRangeByScore(ctx, x.key("retried"), &redis.ZRangeBy{Min: "-inf",
		Max: strconv.FormatInt(before.UnixMilli(), 10), Count: int64(limit)}).Result()
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	es, err := x.load(ctx, ids)
	if err != nil {
		return nil, err
	}
	now := float64(x.clock.Now().UnixMilli())
	pipe := x.rdb.Pipeline()
	out := es[:0]
	for i, e := range es {
		if e == nil || e.State != StateRetried {
			pipe.ZRem(ctx, x.key("retried"), ids[i])
			continue
		}
		pipe.ZAddXX(ctx, x.key("retried"), redis.Z{Score: now, Member: ids[i]})
		out = append(out, e)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("dlq unsettled: %w", err)
	}
	return out, nil
}

// Unwatch stops asking about these retried letters (their message was not
// done for long: they stay retried).
func (x *Index) Unwatch(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	return x.rdb.ZRem(ctx, x.key("retried"), members...).Err()
}
