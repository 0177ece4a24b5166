// Package sources holds the operator console's data sources: the types
// that implement internal/console's interfaces by reading the DLQ index,
// the rate limiter's admin, Kafka, Redis and the conversation archive.
// The dlq-consumer's wiring (internal/service) builds the console with New.
package sources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/state"
)

// Deps are the dlq-consumer's parts and clients the console reads.
type Deps struct {
	Index    *dlq.Index
	Limits   *ratelimit.Admin
	Archive  *archive.Store // nil: the timeline scans the main topic
	Redis    redis.UniversalClient
	Kafka    *kafka.AdminClient
	Coord    *coord.Provider // nil: no fleet view
	Log      *zap.Logger
	Registry *prometheus.Registry
	// Lag reads the schedule-consumers' group, DLQLag the dlq-consumers'
	// own (nil: the DLQ topic's lag is not shown).
	Lag, DLQLag *kafka.Consumer
}

// New builds the admin server on d.
func New(cfg *config.DLQConsumer, d Deps) (*console.Server, error) {
	ac := console.FromConfig(cfg.Admin, cfg.Redis.KeyPrefix)
	for g := range cfg.RateLimit.Groups {
		ac.Groups = append(ac.Groups, g)
	}
	for _, r := range dlq.Reasons {
		ac.Reasons = append(ac.Reasons, string(r))
	}
	ac.Pipeline = NewPipeline(cfg, d)
	if d.Coord != nil {
		// Provider.Close (at the daemon's end) ends the watch.
		view, err := fleet.Watch(context.Background(), d.Coord, cfg.Coord.KeepAlive)
		if err != nil {
			return nil, err
		}
		ac.Fleet = view
	}
	rl := cfg.RateLimit
	ac.RetryPace = func() (int, time.Duration, bool) { return dlq.RetryPace(rl, rl.DefaultGroup) }
	srv, err := console.New(ac, NewDLQStore(d.Index, d.Redis, cfg.Redis.KeyPrefix), rateLimitAdmin{a: d.Limits, x: d.Index}, d.Redis, d.Log, d.Registry)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return srv, nil
}

// DLQStore adapts the DLQ index to the admin API; rdb and prefix reach
// the schedule-consumers' dedup store (batch retries skip what is done).
type DLQStore struct {
	x      *dlq.Index
	rdb    redis.UniversalClient
	prefix string
}

// NewDLQStore is the store on the index x, the schedule-consumers' dedup
// store in rdb under prefix.
func NewDLQStore(x *dlq.Index, rdb redis.UniversalClient, prefix string) DLQStore {
	return DLQStore{x: x, rdb: rdb, prefix: prefix}
}

// DedupPrefix is where, under the deployment's Redis key prefix, the
// schedule-consumers keep their dedup marks (the dlq-consumer reads them).
func DedupPrefix(prefix string) string { return prefix + "dedup:" }

func toAdminMessage(e *dlq.Entry) console.DLQMessage {
	m := console.DLQMessage{ID: e.ID, User: e.UserID, OpenKfID: e.OpenKfID, Reason: string(e.Reason), Details: e.Details,
		State: e.State, FailureTime: e.FailureTime, RetryCount: max(e.RetryCount, e.Attempts), NextRetryTime: e.NextRetryTime,
		Failures: e.Failures, FirstFailure: e.FirstFailure,
		SourceTopic: e.SourceTopic, SourcePartition: e.SourcePartition, SourceOffset: e.SourceOffset,
		Preview: e.Preview, DLQPartition: e.At.Partition, DLQOffset: e.At.Offset}
	switch {
	case !e.Whole:
		// A summary (List): the message is read from the DLQ topic on Get.
	case e.Original != nil:
		m.Message, _ = json.Marshal(e.Original)
	case len(e.OriginalValue) > 0:
		// Undecodable payloads are shown as a JSON string, never lost.
		m.Message, _ = json.Marshal(string(e.OriginalValue))
	}
	return m
}

func toFilter(f console.DLQFilter) dlq.Filter {
	return dlq.Filter{User: f.User, Reason: f.Reason, Review: f.Review, Cursor: f.Cursor, Limit: f.Limit}
}

func (s DLQStore) Stats(ctx context.Context) (console.DLQStats, error) {
	st, err := s.x.Stats(ctx)
	return console.DLQStats{Total: st.Total, ByReason: st.ByReason, Due: st.Due, DueNow: st.DueNow, Review: st.Review, Retried: st.Retried,
		Done: st.Done}, err
}

func (s DLQStore) List(ctx context.Context, f console.DLQFilter) ([]console.DLQMessage, string, error) {
	entries, next, err := s.x.List(ctx, toFilter(f))
	if errors.Is(err, dlq.ErrBadCursor) {
		return nil, "", fmt.Errorf("%w: %w", console.ErrBadCursor, err)
	}
	if err != nil {
		return nil, "", err
	}
	out := make([]console.DLQMessage, len(entries))
	for i, e := range entries {
		out[i] = toAdminMessage(e)
	}
	return out, next, nil
}

func (s DLQStore) Get(ctx context.Context, id string) (console.DLQMessage, error) {
	e, err := s.x.Get(ctx, id)
	if errors.Is(err, dlq.ErrNotFound) {
		return console.DLQMessage{}, console.ErrNotFound
	}
	if err != nil {
		return console.DLQMessage{}, err
	}
	return toAdminMessage(e), nil
}

func (s DLQStore) Retry(ctx context.Context, id string, o console.RetryOptions) error {
	e, err := s.x.Get(ctx, id)
	if errors.Is(err, dlq.ErrNotFound) {
		return console.ErrNotFound
	}
	if err != nil {
		return err
	}
	q := UserDone(e.DeadLetter)
	l := console.Letter{ID: e.ID, User: e.UserID, Reason: string(e.Reason), Key: q.Key, SendTime: q.SendTime}
	o.Batch = ""
	skips, err := s.decide(ctx, []console.Letter{l}, time.Now(), o)
	if err != nil {
		return err
	}
	switch skips[0] {
	case "":
		return nil
	case console.SkipGone:
		return console.ErrNotFound
	default:
		return fmt.Errorf("%w: letter %s (%s, %s) is not retried: %s", console.ErrConflict, id, e.Reason, e.State, explainSkip(skips[0]))
	}
}

// explainSkip says in words why a retry skips a letter.
func explainSkip(skip string) string {
	switch skip {
	case console.SkipDone:
		return "its message is done already (the dedup store holds it as processed)"
	case console.SkipNotRetryable:
		return "its reason is never retried, no retry can fix it: retry it anyway with include_invalid (kfpipectl dlq retry --include-invalid)"
	case console.SkipSettled:
		return "it was retried already (or its message is done); a letter comes back only when its message fails again"
	case console.SkipBusy:
		return "it is due now or being re-injected by the scheduler: it goes anyway"
	}
	return skip
}

// decide is the one selection of an operator's retry, for one letter and
// for a batch, dry run or not: per letter "" (the retry acts on it) or
// why it does not (console.Skip…). A letter whose message is done in the
// dedup store is skipped (and, unless o.DryRun, a retried one is marked
// done in the index); the rest are decided, and unless o.DryRun requeued
// due from `from` on, by the index's RetrySelected in one script.
func (s DLQStore) decide(ctx context.Context, ls []console.Letter, from time.Time, o console.RetryOptions) ([]string, error) {
	out := make([]string, len(ls))
	qs := make([]state.Item, len(ls))
	for i, l := range ls {
		qs[i] = state.Item{Key: l.Key, SendTime: l.SendTime, User: l.User}
	}
	done, err := s.DoneKeys(ctx, qs)
	if err != nil {
		return nil, err
	}
	var ids, doneIDs []string
	var at []int
	for i, l := range ls {
		if done[i] {
			out[i] = console.SkipDone
			doneIDs = append(doneIDs, l.ID)
			continue
		}
		ids, at = append(ids, l.ID), append(at, i)
	}
	if len(doneIDs) > 0 && !o.DryRun {
		es, err := s.x.Summaries(ctx, doneIDs)
		if err != nil {
			return nil, err
		}
		if _, err := s.x.MarkDone(ctx, es); err != nil {
			return nil, err
		}
	}
	vs, err := s.x.RetrySelected(ctx, ids, dlq.RetryRequest{DryRun: o.DryRun, IncludeNotRetryable: o.IncludeInvalid,
		Batch: o.Batch, At: from})
	if err != nil {
		return nil, err
	}
	for j, v := range vs {
		switch v {
		case dlq.VerdictRetry, dlq.VerdictActed:
			out[at[j]] = ""
		case dlq.VerdictGone:
			out[at[j]] = console.SkipGone
		case dlq.VerdictNotRetryable:
			out[at[j]] = console.SkipNotRetryable
		case dlq.VerdictSettled:
			out[at[j]] = console.SkipSettled
		default:
			out[at[j]] = console.SkipBusy
		}
	}
	return out, nil
}

// Select walks the index's entries f selects (newest first, as List
// pages them), then sorts them into their messages' order. For a retry it
// reads the whole letters back from the DLQ topic (a thousand at a time)
// for their messages' dedup keys, and decides each as the retry would
// (decide, dry run).
func (s DLQStore) Select(ctx context.Context, f console.DLQFilter, retry *console.RetryOptions) ([]console.Letter, error) {
	var es []*dlq.Entry
	df := toFilter(f)
	df.Limit, df.Cursor = 500, ""
	for {
		entries, next, err := s.x.List(ctx, df)
		if err != nil {
			return nil, err
		}
		es = append(es, entries...)
		if next == "" {
			break
		}
		df.Cursor = next
	}
	if f.Limit > 0 && len(es) > f.Limit {
		// The oldest letters, not the newest the list starts with: the
		// scheduler sends a user's letters back in the user's order, so a
		// user's newer letters retried before older ones that still wait
		// would wait behind them (for a blocked user's letters, until the
		// block's old end), whatever the batch's estimate said.
		slices.SortStableFunc(es, func(a, b *dlq.Entry) int { return firstFailed(a).Compare(firstFailed(b)) })
		es = es[:f.Limit]
	}
	dlq.SortBySource(es, func(e *dlq.Entry) *chatmsg.DeadLetter { return e.DeadLetter })
	ls := make([]console.Letter, len(es))
	for i, e := range es {
		ls[i] = console.Letter{ID: e.ID, User: e.UserID, Reason: string(e.Reason)}
	}
	if retry == nil {
		return ls, nil
	}
	const chunk = 1000
	for lo := 0; lo < len(es); lo += chunk {
		part := es[lo:min(lo+chunk, len(es))]
		if err := s.x.Whole(ctx, part); err != nil {
			return nil, fmt.Errorf("reading letters for their dedup keys: %w", err)
		}
		for i, e := range part {
			q := UserDone(e.DeadLetter)
			ls[lo+i].Key, ls[lo+i].SendTime = q.Key, q.SendTime
			part[i] = nil // the whole letter is not kept
		}
	}
	o := *retry
	o.DryRun = true // selecting acts on nothing; the batch acts later
	skips, err := s.decide(ctx, ls, time.Now(), o)
	if err != nil {
		return nil, err
	}
	for i, sk := range skips {
		ls[i].Skip, ls[i].Done = sk, sk == console.SkipDone
	}
	return ls, nil
}

// firstFailed is when the letter's message first failed: the order the
// scheduler keeps a user's letters in.
func firstFailed(e *dlq.Entry) time.Time {
	if e.FirstFailure != nil {
		return *e.FirstFailure
	}
	return e.FailureTime
}

// dedupKey is the key the schedule-consumer's dedup store keeps the
// letter's message under ("" when the letter does not say).
func dedupKey(dl *chatmsg.DeadLetter) string {
	if dl.OpenKfID == "" || dl.UpstreamMsgID == "" {
		return ""
	}
	m := chatmsg.ChatMessage{OpenKfID: dl.OpenKfID, UpstreamMsgID: dl.UpstreamMsgID}
	return m.DedupKey()
}

// UserDone is the dedup question for a letter: its message's key ("" when
// the letter does not say), its routing user and its send time, which a
// per-user store (dedup.store leases) needs as well.
func UserDone(dl *chatmsg.DeadLetter) state.Item {
	q := state.Item{Key: dedupKey(dl), User: dl.UserID}
	if dl.Original != nil {
		q.SendTime = dl.Original.SendTime
	}
	return q
}

// DoneKeys asks the state store which letters' messages are done (a
// letter without a key never is), and the old dedup stores' keys, which
// hold marks for one dedup.ttl after the switch.
func (s DLQStore) DoneKeys(ctx context.Context, qs []state.Item) ([]bool, error) {
	keys := make([]string, len(qs))
	for i, q := range qs {
		keys[i] = q.Key
	}
	done, err := state.LegacyDone(ctx, s.rdb, DedupPrefix(s.prefix), keys)
	if err != nil {
		return nil, err
	}
	byUser, err := state.LegacyDoneUsers(ctx, s.rdb, DedupPrefix(s.prefix), qs)
	if err != nil {
		return nil, err
	}
	marked, err := state.DoneAnywhere(ctx, s.rdb, s.prefix, qs)
	if err != nil {
		return nil, err
	}
	for i, k := range keys {
		done[i] = (done[i] || byUser[i] || marked[i]) && k != ""
	}
	return done, nil
}

// RetryLetters requeues ls in order, due from `from` on, deciding each
// as its dry run did (decide): a letter this batch requeued already (a
// resumed batch) counts as acted, one whose message is done is skipped,
// one no longer retryable (gone, retried or due meanwhile) is gone.
func (s DLQStore) RetryLetters(ctx context.Context, ls []console.Letter, from time.Time, o console.RetryOptions) ([]console.Outcome, error) {
	o.DryRun = false
	skips, err := s.decide(ctx, ls, from, o)
	if err != nil {
		return nil, err
	}
	outs := make([]console.Outcome, len(ls))
	for i, sk := range skips {
		switch sk {
		case "":
			outs[i] = console.OutcomeActed
		case console.SkipDone:
			outs[i] = console.OutcomeDone
		default:
			outs[i] = console.OutcomeGone
		}
	}
	return outs, nil
}

// Delivery reads the letters' summaries: a letter re-injected since the
// batch requeued it (its retried time, kept when it fails again) is back;
// one still due, the batch's or released by the scheduler while its user
// is blocked, waits; one no longer in the index, or requeued by another
// batch, is gone.
func (s DLQStore) Delivery(ctx context.Context, ids []string, batch string, since time.Time) ([]console.Delivery, error) {
	es, err := s.x.Summaries(ctx, ids)
	if err != nil {
		return nil, err
	}
	since = since.Truncate(time.Millisecond) // the index keeps milliseconds
	out := make([]console.Delivery, len(ids))
	for i, e := range es {
		switch {
		case e == nil:
			out[i].State = console.DeliveryGone
		case e.RetriedAt != nil && !e.RetriedAt.Before(since):
			out[i].State = console.DeliveryDelivered
		case e.State == dlq.StateDue && (e.Batch == batch || e.Batch == ""):
			out[i].State = console.DeliveryWaiting
			if e.NextRetryTime != nil {
				out[i].Due = *e.NextRetryTime
			}
		default:
			out[i].State = console.DeliveryGone
		}
	}
	return out, nil
}

// PurgeLetters deletes ls, recording each purge in the DLQ topic.
func (s DLQStore) PurgeLetters(ctx context.Context, ls []console.Letter) ([]console.Outcome, error) {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	es, err := s.x.Summaries(ctx, ids)
	if err != nil {
		return nil, err
	}
	gone, err := s.x.PurgeEntries(ctx, es)
	if err != nil {
		return nil, err
	}
	outs := make([]console.Outcome, len(ls))
	for i, g := range gone {
		if !g {
			outs[i] = console.OutcomeGone
		}
	}
	return outs, nil
}

func (s DLQStore) Export(ctx context.Context, f console.DLQFilter, fn func(console.DLQMessage) error) error {
	return s.x.Export(ctx, toFilter(f), func(e *dlq.Entry) error { return fn(toAdminMessage(e)) })
}

// rateLimitAdmin adapts ratelimit.Admin to the admin API.
// rateLimitAdmin adapts the rate limiter's admin to the admin API; x, when
// set, gives a user's status their recent dead letters.
type rateLimitAdmin struct {
	a *ratelimit.Admin
	x *dlq.Index
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func mapRLErr(err error) error {
	switch {
	case errors.Is(err, ratelimit.ErrUnknownGroup):
		return fmt.Errorf("%w: %w", console.ErrUnknownGroup, err)
	case errors.Is(err, ratelimit.ErrNotWhitelisted):
		return fmt.Errorf("%w: %w", console.ErrConflict, err)
	}
	return err
}

func (r rateLimitAdmin) Status(ctx context.Context, user string) (console.RateLimitStatus, error) {
	s, err := r.a.Status(ctx, user)
	st := console.RateLimitStatus{User: s.User, Group: s.Group, Blocked: s.Blocked, BlockedUntil: optTime(s.BlockedUntil),
		Permanent: s.Permanent, BlockHistory: s.History}
	if g := s.Rule; g != nil {
		st.Rule = &console.RateRule{WindowSeconds: g.WindowSeconds, MaxMessages: g.MaxMessages, PenaltyThreshold: g.PenaltyThreshold, BlockHours: g.BlockHours}
	}
	if err == nil && r.x != nil {
		st.RecentLetters, err = r.recentLetters(ctx, user)
	}
	return st, mapRLErr(err)
}

// recentLetters counts the user's dead letters of the last hour by reason.
func (r rateLimitAdmin) recentLetters(ctx context.Context, user string) (map[string]int, error) {
	since := time.Now().Add(-time.Hour)
	out := map[string]int{}
	f := dlq.Filter{User: user, Limit: 500}
	for {
		es, next, err := r.x.List(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			if e.FailureTime.Before(since) {
				return out, nil // newest first: the rest are older
			}
			out[string(e.Reason)]++
		}
		if next == "" {
			return out, nil
		}
		f.Cursor = next
	}
}

func (r rateLimitAdmin) Rules(ctx context.Context) (console.RateRules, error) {
	groups, v, err := r.a.RulesVersion(ctx)
	out := console.RateRules{Backend: r.a.RulesBackend(), Version: v, Groups: make(map[string]console.RateRule, len(groups))}
	for n, g := range groups {
		out.Groups[n] = console.RateRule{WindowSeconds: g.WindowSeconds, MaxMessages: g.MaxMessages,
			PenaltyThreshold: g.PenaltyThreshold, BlockHours: g.BlockHours}
	}
	return out, err
}

func (r rateLimitAdmin) SetRules(ctx context.Context, groups map[string]console.RateRule, version int64) (int64, error) {
	in := make(map[string]config.RateGroup, len(groups))
	for n, g := range groups {
		in[n] = config.RateGroup{WindowSeconds: g.WindowSeconds, MaxMessages: g.MaxMessages,
			PenaltyThreshold: g.PenaltyThreshold, BlockHours: g.BlockHours}
	}
	v, err := r.a.SetRulesIf(ctx, in, version)
	var conflict *ratelimit.RulesConflictError
	switch {
	case errors.As(err, &conflict):
		return 0, &console.VersionConflictError{Current: conflict.Current}
	case errors.Is(err, ratelimit.ErrInvalidRules):
		return 0, fmt.Errorf("%w: %w", console.ErrInvalidRules, err)
	}
	return v, err
}

func (r rateLimitAdmin) Unblock(ctx context.Context, user string) error {
	return mapRLErr(r.a.Unblock(ctx, user))
}

func (r rateLimitAdmin) Block(ctx context.Context, user string, d time.Duration) error {
	return mapRLErr(r.a.Block(ctx, user, d))
}

func (r rateLimitAdmin) SetGroup(ctx context.Context, user, group string) error {
	return mapRLErr(r.a.SetGroup(ctx, user, group))
}

func (r rateLimitAdmin) Whitelist(ctx context.Context, user string) error {
	return mapRLErr(r.a.Whitelist(ctx, user))
}

func (r rateLimitAdmin) RemoveWhitelist(ctx context.Context, user string) error {
	return mapRLErr(r.a.RemoveWhitelist(ctx, user))
}

func (r rateLimitAdmin) ListBlocked(ctx context.Context, cursor, limit int) ([]console.BlockedUser, int, error) {
	users, next, err := r.a.ListBlocked(ctx, cursor, limit)
	out := make([]console.BlockedUser, len(users))
	for i, u := range users {
		out[i] = console.BlockedUser{User: u.User, BlockedUntil: optTime(u.BlockedUntil), Permanent: u.Permanent}
	}
	return out, next, mapRLErr(err)
}

func (s DLQStore) Inflow(ctx context.Context, to time.Time, step time.Duration, n int) (map[string][]int64, error) {
	return s.x.Inflow(ctx, to, step, n)
}
