package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// memDLQ is an in-memory DLQStore for handler tests. Its Retry rules are
// the ones the interface documents: unknown ⇒ ErrNotFound, a reason no
// retry can fix (invalid_message, handler_rejected) without IncludeInvalid
// or already due now ⇒ ErrConflict.
type memDLQ struct {
	mu      sync.Mutex
	now     time.Time
	msgs    []*DLQMessage     // newest first
	retried []string          // IDs passed to Retry successfully, in order
	fail    error             // returned by every call when set
	done    map[string]bool   // IDs whose message is done in the dedup store
	batchOf map[string]string // ID → the batch that requeued it
	hold    map[string]bool   // IDs Delivery says still wait (the scheduler's pacing)
}

func newMemDLQ(now time.Time, msgs ...DLQMessage) *memDLQ {
	d := &memDLQ{now: now, done: map[string]bool{}}
	for i := range msgs {
		m := msgs[i]
		d.msgs = append(d.msgs, &m)
	}
	return d
}

func (d *memDLQ) match(f DLQFilter, m *DLQMessage) bool {
	return (f.User == "" || m.User == f.User) && (f.Reason == "" || m.Reason == f.Reason) &&
		(f.Review == nil || (m.State == "review") == *f.Review)
}

func (d *memDLQ) Stats(context.Context) (DLQStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return DLQStats{}, d.fail
	}
	s := DLQStats{ByReason: map[string]int64{}}
	for _, m := range d.msgs {
		s.Total++
		s.ByReason[m.Reason]++
		switch m.State {
		case "due":
			s.Due++
			if !m.NextRetryTime.After(d.now) {
				s.DueNow++
			}
		case "review":
			s.Review++
		}
	}
	return s, nil
}

func (d *memDLQ) List(_ context.Context, f DLQFilter) ([]DLQMessage, string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, "", d.fail
	}
	start := 0
	if f.Cursor != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(f.Cursor, "c"))
		if err != nil || !strings.HasPrefix(f.Cursor, "c") || n < 0 || n > len(d.msgs) {
			return nil, "", fmt.Errorf("list: %w", ErrBadCursor)
		}
		start = n
	}
	var out []DLQMessage
	for i := start; i < len(d.msgs); i++ {
		if !d.match(f, d.msgs[i]) {
			continue
		}
		out = append(out, *d.msgs[i])
		if len(out) == f.Limit && i+1 < len(d.msgs) {
			return out, "c" + strconv.Itoa(i+1), nil
		}
	}
	return out, "", nil
}

func (d *memDLQ) find(id string) *DLQMessage {
	for _, m := range d.msgs {
		if m.ID == id {
			return m
		}
	}
	return nil
}

func (d *memDLQ) Get(_ context.Context, id string) (DLQMessage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return DLQMessage{}, d.fail
	}
	if m := d.find(id); m != nil {
		return *m, nil
	}
	return DLQMessage{}, ErrNotFound
}

// skip is the fake's one retry decision ("" : retry), as the real
// store's: done, gone, settled (retried/done), not retryable, busy.
func (d *memDLQ) skip(m *DLQMessage, key string, o RetryOptions) string {
	switch {
	case m == nil:
		return SkipGone
	case d.done[key]:
		return SkipDone
	case o.Batch != "" && d.batchOf[m.ID] == o.Batch:
		return ""
	case m.State == "retried" || m.State == "done":
		return SkipSettled
	case !deadletter.IsRecoverable(deadletter.Reason(m.Reason)) && !o.IncludeInvalid:
		return SkipNotRetryable
	case m.State == "due" && m.NextRetryTime != nil && !m.NextRetryTime.After(d.now):
		return SkipBusy
	}
	return ""
}

func (d *memDLQ) Retry(_ context.Context, id string, o RetryOptions) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return d.fail
	}
	m := d.find(id)
	switch sk := d.skip(m, id, o); sk {
	case "":
	case SkipGone:
		return fmt.Errorf("retry %s: %w", id, ErrNotFound)
	default:
		return fmt.Errorf("%w: letter %s is not retried: %s", ErrConflict, id, sk)
	}
	if o.DryRun {
		return nil
	}
	now := d.now
	m.State, m.NextRetryTime = "due", &now
	d.retried = append(d.retried, m.ID)
	return nil
}

// Select returns the matching letters in source order; a letter's Key is
// its ID, and for a retry Skip says what the retry would skip.
func (d *memDLQ) Select(_ context.Context, f DLQFilter, retry *RetryOptions) ([]Letter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	var sel []*DLQMessage
	for _, m := range d.msgs {
		if f.Limit > 0 && len(sel) >= f.Limit {
			break
		}
		if d.match(f, m) {
			sel = append(sel, m)
		}
	}
	slices.SortStableFunc(sel, func(a, b *DLQMessage) int {
		if a.SourcePartition != b.SourcePartition {
			return int(a.SourcePartition - b.SourcePartition)
		}
		return int(a.SourceOffset - b.SourceOffset)
	})
	out := make([]Letter, len(sel))
	for i, m := range sel {
		out[i] = Letter{ID: m.ID, User: m.User, Reason: m.Reason, Key: m.ID}
		if retry != nil {
			out[i].Skip = d.skip(m, m.ID, RetryOptions{IncludeInvalid: retry.IncludeInvalid})
			out[i].Done = out[i].Skip == SkipDone
		}
	}
	return out, nil
}

func (d *memDLQ) RetryLetters(_ context.Context, ls []Letter, from time.Time, o RetryOptions) ([]Outcome, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	if d.batchOf == nil {
		d.batchOf = map[string]string{}
	}
	outs := make([]Outcome, len(ls))
	for i, l := range ls {
		m := d.find(l.ID)
		switch sk := d.skip(m, l.Key, o); {
		case sk == SkipDone:
			outs[i] = OutcomeDone
		case sk != "":
			outs[i] = OutcomeGone
		case d.batchOf[m.ID] == o.Batch && o.Batch != "":
			outs[i] = OutcomeActed // requeued by this batch before it was resumed
		default:
			at := from.Add(time.Duration(i) * time.Millisecond)
			m.State, m.NextRetryTime = "due", &at
			d.batchOf[m.ID] = o.Batch
			d.retried = append(d.retried, m.ID)
		}
	}
	return outs, nil
}

// Delivery plays the scheduler: a letter a batch requeued is back in the
// main topic at once unless the test holds it (hold), which keeps it
// waiting until its due time.
func (d *memDLQ) Delivery(_ context.Context, ids []string, batch string, _ time.Time) ([]Delivery, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	out := make([]Delivery, len(ids))
	for i, id := range ids {
		m := d.find(id)
		switch {
		case m == nil:
			out[i].State = DeliveryGone
		case d.hold[id] && d.batchOf[id] == batch && m.State == "due" && m.NextRetryTime != nil:
			out[i] = Delivery{State: DeliveryWaiting, Due: *m.NextRetryTime}
		default:
			out[i].State = DeliveryDelivered
		}
	}
	return out, nil
}

func (d *memDLQ) PurgeLetters(_ context.Context, ls []Letter) ([]Outcome, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	outs := make([]Outcome, len(ls))
	for i, l := range ls {
		n := len(d.msgs)
		d.msgs = slices.DeleteFunc(d.msgs, func(m *DLQMessage) bool { return m.ID == l.ID })
		if len(d.msgs) == n {
			outs[i] = OutcomeGone
		}
	}
	return outs, nil
}

func (d *memDLQ) Export(ctx context.Context, f DLQFilter, fn func(DLQMessage) error) error {
	d.mu.Lock()
	msgs := make([]DLQMessage, 0, len(d.msgs))
	for _, m := range d.msgs {
		if d.match(f, m) {
			msgs = append(msgs, *m)
		}
	}
	fail := d.fail
	d.mu.Unlock()
	if fail != nil {
		return fail
	}
	for _, m := range msgs {
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

func (d *memDLQ) retriedIDs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.retried)
}

// memRL is an in-memory RateLimitAdmin.
type memRL struct {
	mu     sync.Mutex
	now    time.Time
	groups map[string]bool
	group  map[string]string
	block  map[string]time.Duration // 0 = permanent
	fail   error
	// rules and version are the group rules (nil: the defaults) and their
	// compare-and-set version.
	rules   map[string]RateRule
	version int64
}

func newMemRL(now time.Time) *memRL {
	return &memRL{now: now, groups: map[string]bool{"normal": true, "vip": true, "suspicious": true, "whitelist": true},
		group: map[string]string{}, block: map[string]time.Duration{}}
}

func (r *memRL) Status(_ context.Context, user string) (RateLimitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return RateLimitStatus{}, r.fail
	}
	st := RateLimitStatus{User: user, Group: r.group[user]}
	if st.Group == "" {
		st.Group = "normal"
	}
	if d, ok := r.block[user]; ok {
		st.Blocked, st.Permanent = true, d == 0
		if d > 0 {
			t := r.now.Add(d)
			st.BlockedUntil = &t
		}
	}
	return st, nil
}

func (r *memRL) Unblock(_ context.Context, user string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	delete(r.block, user)
	return nil
}

func (r *memRL) Block(_ context.Context, user string, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.block[user] = d
	return nil
}

func (r *memRL) SetGroup(_ context.Context, user, group string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if !r.groups[group] {
		return fmt.Errorf("%w: %q", ErrUnknownGroup, group)
	}
	r.group[user] = group
	return nil
}

func (r *memRL) Whitelist(_ context.Context, user string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.group[user] = "whitelist"
	delete(r.block, user)
	return nil
}

func (r *memRL) RemoveWhitelist(_ context.Context, user string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if r.group[user] != "whitelist" {
		return fmt.Errorf("%w: %s is not whitelisted", ErrConflict, user)
	}
	delete(r.group, user)
	return nil
}

func (r *memRL) ListBlocked(_ context.Context, cursor, limit int) ([]BlockedUser, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return nil, 0, r.fail
	}
	users := make([]string, 0, len(r.block))
	for u := range r.block {
		users = append(users, u)
	}
	slices.Sort(users)
	var out []BlockedUser
	for i := cursor; i < len(users) && len(out) < limit; i++ {
		b := BlockedUser{User: users[i], Permanent: r.block[users[i]] == 0}
		if !b.Permanent {
			t := r.now.Add(r.block[users[i]])
			b.BlockedUntil = &t
		}
		out = append(out, b)
	}
	next := 0
	if cursor+len(out) < len(users) {
		next = cursor + len(out)
	}
	return out, next, nil
}

var errStoreDown = errors.New("dial tcp 10.9.9.9:6379: connection refused")

func (d *memDLQ) Inflow(_ context.Context, to time.Time, step time.Duration, n int) (map[string][]int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	from := to.Add(-time.Duration(n) * step)
	out := map[string][]int64{}
	for _, m := range d.msgs {
		if m.FailureTime.Before(from) || !m.FailureTime.Before(to) {
			continue
		}
		if out[m.Reason] == nil {
			out[m.Reason] = make([]int64, n)
		}
		out[m.Reason][int(m.FailureTime.Sub(from)/step)]++
	}
	return out, nil
}

// memPipeline is a Pipeline with fixed answers (or errors).
type memPipeline struct {
	mu        sync.Mutex
	accounts  []AccountSync
	lag       []PartitionLag
	lagErr    error
	consumers []ConsumerStatus
}

func (p *memPipeline) Accounts(context.Context) ([]AccountSync, error) { return p.accounts, nil }

func (p *memPipeline) Lag(context.Context) ([]PartitionLag, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lag), p.lagErr
}

func (p *memPipeline) Consumers(context.Context) ([]ConsumerStatus, error) {
	return slices.Clone(p.consumers), nil
}

func (p *memPipeline) setLag(lag []PartitionLag, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lag, p.lagErr = lag, err
}

func (r *memRL) Rules(context.Context) (RateRules, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rules == nil {
		r.rules = map[string]RateRule{"normal": {WindowSeconds: 10, MaxMessages: 5, PenaltyThreshold: 3, BlockHours: 1}}
	}
	return RateRules{Backend: "memory", Version: r.version, Groups: r.rules}, r.fail
}

// SetRules is compare-and-set on the fake's version, as both real backends
// do; rules without "normal" are refused like the real validation.
func (r *memRL) SetRules(_ context.Context, groups map[string]RateRule, version int64) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	if version != r.version {
		return 0, &VersionConflictError{Current: r.version}
	}
	if _, ok := groups["normal"]; !ok {
		return 0, fmt.Errorf("%w: rate_limit.groups must keep the default group normal", ErrInvalidRules)
	}
	r.rules, r.version = groups, r.version+1
	return r.version, nil
}
