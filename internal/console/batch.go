package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// An operator's batch retry or purge does not run inside the request: the
// request selects the letters (a dry run stops there and answers what the
// batch would do), stores them in their messages' order with the batch,
// and a batch runner acts on them at Config.BatchRate letters a second.
// Its progress is in Redis, so any dlq-consumer replica shows it and
// cancels it, and a batch whose runner died (SIGKILL, lost node) is taken
// over by another replica, or the restarted one, once its lease expires.
//
// Keys, under prefix + "batch:":
//
//	<id>         string, the Batch as JSON (progress included)
//	<id>:ids     list, the letters in order ("id\x1fuser\x1fkey\x1fsend_time")
//	<id>:acted   list, the IDs of the letters a retry requeued
//	<id>:lease   string, the runner's owner ID (PX batchLease)
//	<id>:cancel  string, who asked to cancel
//	index        sorted set of batch IDs by creation time
//
// Every key expires batchKeep after the batch's last write.

// Batch actions.
const (
	ActionRetry = "retry"
	ActionPurge = "purge"
)

// Batch states.
const (
	BatchRunning   = "running"
	BatchDone      = "done"
	BatchCancelled = "cancelled"
)

const (
	batchKeep  = 7 * 24 * time.Hour
	batchLease = 10 * time.Second
	batchTick  = 100 * time.Millisecond
	// batchChunk caps the letters one tick acts on.
	batchChunk = 500
	// batchesListed is how many batches GET /admin/dlq/batches shows and
	// the index keeps.
	batchesListed = 50
	// deliveryPoll is how often a retry batch whose letters are all
	// requeued looks whether they are back in the main topic.
	deliveryPoll = time.Second
)

// Batch is a batch retry or purge and its progress.
type Batch struct {
	ID     string `json:"id"`
	Action string `json:"action"` // retry or purge
	// Filter is the selection, as the audit entry names it.
	Filter string `json:"filter"`
	Who    string `json:"who"`
	Reason string `json:"reason"`
	Rate   int    `json:"rate"` // letters a second
	Total  int    `json:"total"`
	Users  int    `json:"users"`
	// Position is how many letters, in order, the batch went through.
	Position int `json:"position"`
	// Acted: retried (scheduled for a retry now) or purged.
	Acted int `json:"acted"`
	// SkippedDone: not retried, their message is done in the dedup store.
	SkippedDone int `json:"skipped_done"`
	// Gone: purged, expired or no longer retryable meanwhile (retried
	// by the scheduler or another batch, or due now).
	Gone int `json:"gone"`
	// IncludeInvalid: the batch retries letters whose reason is never
	// retried (invalid_message, handler_rejected) too.
	IncludeInvalid bool   `json:"include_invalid,omitempty"`
	State          string `json:"state"`
	// Error is the last store failure while running (it retries).
	Error       string     `json:"error,omitempty"`
	CancelledBy string     `json:"cancelled_by,omitempty"`
	Created     time.Time  `json:"created"`
	Updated     time.Time  `json:"updated"`
	Finished    *time.Time `json:"finished,omitempty"`
	// NextDue is the due time of the next letter it retries: each is due
	// a millisecond after the one before, across runners too.
	NextDue time.Time `json:"next_due,omitzero"`
	// Runner is the dlq-consumer running it now ("" while a running batch
	// waits for a replica to take it over); set on reads only.
	Runner string `json:"runner,omitempty"`

	// A retry's letters go back to the main topic when the scheduler
	// re-injects them, at their due time: its per-user pacing holds a
	// user's letters beyond one window's worth for the next windows. A
	// retry batch is running until none of the letters it requeued
	// (Acted) waits any more.
	//
	// Delivered: requeued letters the scheduler has put back in the main
	// topic. Waiting: requeued letters still waiting in the DLQ, the next
	// due at NextRetry, the last at LastRetry.
	Delivered int        `json:"delivered"`
	Waiting   int        `json:"waiting"`
	NextRetry *time.Time `json:"next_retry,omitempty"`
	LastRetry *time.Time `json:"last_retry,omitempty"`
}

// batches runs the batches of one admin server.
type batches struct {
	s      *base
	owner  string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool
}

func newBatches(s *base) *batches {
	ctx, cancel := context.WithCancel(context.Background())
	return &batches{s: s, owner: "admin-" + randomHex(6), ctx: ctx, cancel: cancel, running: map[string]bool{}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// key names a batch's keys: batch:<id>, batch:<id>:ids, batch:<id>:lease
// and batch:index. On a Redis Cluster the first part is a hash tag
// (batch:{<id>}:lease), so the lease-checked save (one script over the
// batch and its lease) stays in one slot; elsewhere names are unchanged.
func (bs *batches) key(parts ...string) string {
	parts = slices.Clone(parts)
	parts[0] = redisconn.Tag(bs.s.rdb, parts[0])
	return bs.s.cfg.Prefix + "batch:" + strings.Join(parts, ":")
}

// newID returns a batch ID that sorts by creation time.
func (bs *batches) newID() string {
	return bs.s.clock.Now().UTC().Format("20060102T150405") + "-" + randomHex(4)
}

// start stores b and its letters, takes its lease and runs it.
func (bs *batches) start(ctx context.Context, b *Batch, ls []Letter) error {
	rdb := bs.s.rdb
	idsKey := bs.key(b.ID, "ids")
	for lo := 0; lo < len(ls); lo += 1000 {
		vals := make([]any, 0, 1000)
		for _, l := range ls[lo:min(lo+1000, len(ls))] {
			vals = append(vals, l.ID+"\x1f"+l.User+"\x1f"+l.Key+"\x1f"+strconv.FormatInt(l.SendTime, 10))
		}
		if err := rdb.RPush(ctx, idsKey, vals...).Err(); err != nil {
			return fmt.Errorf("storing the batch's letters: %w", err)
		}
	}
	if err := rdb.Expire(ctx, idsKey, batchKeep).Err(); err != nil {
		return fmt.Errorf("storing the batch's letters: %w", err)
	}
	if err := rdb.Set(ctx, bs.key(b.ID, "lease"), bs.owner, batchLease).Err(); err != nil {
		return fmt.Errorf("taking the batch's lease: %w", err)
	}
	if err := bs.save(ctx, b); err != nil {
		return err
	}
	pipe := rdb.TxPipeline()
	pipe.ZAdd(ctx, bs.key("index"), redis.Z{Score: float64(b.Created.UnixMilli()), Member: b.ID})
	pipe.ZRemRangeByRank(ctx, bs.key("index"), 0, -batchesListed-1)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("listing the batch: %w", err)
	}
	run := *b // the runner's own copy: the caller answers with b
	bs.launch(&run)
	return nil
}

// saveScript writes the batch's JSON if ARGV[1] holds its lease (KEYS[2]).
var saveScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`)

var errLeaseLost = errors.New("admin: batch lease lost")

// save writes b, if this runner holds its lease.
func (bs *batches) save(ctx context.Context, b *Batch) error {
	b.Updated = bs.s.clock.Now()
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	n, err := saveScript.Run(ctx, bs.s.rdb, []string{bs.key(b.ID), bs.key(b.ID, "lease")},
		bs.owner, data, batchKeep.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("saving batch %s: %w", b.ID, err)
	}
	if n == 0 {
		return errLeaseLost
	}
	return nil
}

// renewScript extends the lease KEYS[1] if ARGV[1] holds it.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// releaseScript deletes the lease KEYS[1] if ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
`)

// launch runs b on a goroutine unless this server runs it already.
func (bs *batches) launch(b *Batch) {
	bs.mu.Lock()
	if bs.running[b.ID] {
		bs.mu.Unlock()
		return
	}
	bs.running[b.ID] = true
	bs.mu.Unlock()
	bs.wg.Go(func() {
		defer func() {
			bs.mu.Lock()
			delete(bs.running, b.ID)
			bs.mu.Unlock()
		}()
		bs.run(b)
	})
}

// run acts on b's letters at its rate until they are all done, it is
// cancelled, its lease is lost or the server closes (the lease is then
// released, so another replica resumes it at once).
func (bs *batches) run(b *Batch) {
	ctx, s := bs.ctx, bs.s
	log := s.log.With(zap.String("batch", b.ID), zap.String("action", b.Action))
	leaseKey := bs.key(b.ID, "lease")
	defer func() {
		// Not ctx: it is cancelled when the server closes.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = releaseScript.Run(rctx, s.rdb, []string{leaseKey}, bs.owner).Err()
	}()
	tick := time.NewTicker(batchTick)
	defer tick.Stop()
	var tokens float64
	last, renewed := time.Now(), time.Now()
	var pending []string // the requeued letters not yet back (nil: not read yet)
	var watched time.Time
	for {
		select {
		case <-ctx.Done():
			log.Info("batch paused: server closing; another dlq-consumer resumes it", zap.Int("position", b.Position))
			return
		case <-tick.C:
		}
		now := time.Now()
		if now.Sub(renewed) >= batchLease/4 {
			ok, err := renewScript.Run(ctx, s.rdb, []string{leaseKey}, bs.owner, batchLease.Milliseconds()).Int()
			if err == nil && ok == 0 {
				log.Warn("batch lease lost: another dlq-consumer runs it")
				return
			}
			if err == nil {
				renewed = now
			}
		}
		if who, err := s.rdb.Get(ctx, bs.key(b.ID, "cancel")).Result(); err == nil {
			b.State, b.CancelledBy = BatchCancelled, who
			bs.finish(ctx, b, log)
			return
		}
		tokens = min(tokens+float64(b.Rate)*now.Sub(last).Seconds(), float64(max(b.Rate, batchChunk)))
		last = now
		n := min(int(tokens), batchChunk, b.Total-b.Position)
		if b.Position >= b.Total {
			if b.Action == ActionRetry && b.Acted > 0 {
				// A big batch is looked at less often: each look reads
				// every letter still out (5,000 a second at most).
				if now.Sub(watched) < deliveryPoll*time.Duration(max(1, len(pending)/5000)) {
					continue
				}
				watched = now
				left, err := bs.watch(ctx, b, &pending)
				if errors.Is(err, errLeaseLost) {
					log.Warn("batch lease lost: another dlq-consumer runs it")
					return
				}
				if err != nil {
					if ctx.Err() == nil {
						log.Warn("batch delivery check failed; retrying", zap.Error(err))
					}
					b.Error = err.Error()
					continue
				}
				if left > 0 {
					continue
				}
			}
			b.State = BatchDone
			bs.finish(ctx, b, log)
			return
		}
		if n == 0 {
			continue
		}
		if err := bs.step(ctx, b, n); err != nil {
			if errors.Is(err, errLeaseLost) {
				log.Warn("batch lease lost: another dlq-consumer runs it")
				return
			}
			if ctx.Err() == nil {
				log.Warn("batch step failed; retrying", zap.Error(err))
			}
			b.Error = err.Error()
			continue
		}
		tokens -= float64(n)
	}
}

// step acts on the next n letters and saves the progress.
func (bs *batches) step(ctx context.Context, b *Batch, n int) error {
	s := bs.s
	raw, err := s.rdb.LRange(ctx, bs.key(b.ID, "ids"), int64(b.Position), int64(b.Position+n-1)).Result()
	if err != nil {
		return fmt.Errorf("reading the batch's letters: %w", err)
	}
	ls := make([]Letter, len(raw))
	for i, r := range raw {
		parts := strings.SplitN(r, "\x1f", 4)
		for len(parts) < 4 {
			parts = append(parts, "")
		}
		// The send time finds the message in a per-user dedup store
		// (dedup.store leases), as the dry run's Select did.
		st, _ := strconv.ParseInt(parts[3], 10, 64)
		ls[i] = Letter{ID: parts[0], User: parts[1], Key: parts[2], SendTime: st}
	}
	var outs []Outcome
	switch b.Action {
	case ActionRetry:
		// Each letter due a millisecond after the one before it, across
		// steps too: the scheduler re-injects them in this order. The due
		// times are reserved (saved) before any letter gets one, so a
		// runner resuming after a crash mid-step schedules after them and
		// finds this step's letters due already (OutcomeActed, not
		// scheduled again).
		from := later(s.clock.Now(), b.NextDue)
		b.NextDue = from.Add(time.Duration(len(ls)) * time.Millisecond)
		if err := bs.save(ctx, b); err != nil {
			return err
		}
		outs, err = s.dlq.RetryLetters(ctx, ls, from, RetryOptions{IncludeInvalid: b.IncludeInvalid, Batch: b.ID})
	default:
		outs, err = s.dlq.PurgeLetters(ctx, ls)
	}
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		// The list expired or was deleted: nothing more to do.
		b.Position = b.Total
	}
	if b.Action == ActionRetry {
		// Kept for the delivery watch. A step run again after a crash
		// lists its letters again: the watch reads each once.
		var acted []any
		for i, o := range outs {
			if o == OutcomeActed {
				acted = append(acted, ls[i].ID)
			}
		}
		if len(acted) > 0 {
			key := bs.key(b.ID, "acted")
			pipe := s.rdb.TxPipeline()
			pipe.RPush(ctx, key, acted...)
			pipe.Expire(ctx, key, batchKeep)
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("keeping the batch's requeued letters: %w", err)
			}
		}
	}
	for _, o := range outs {
		switch o {
		case OutcomeActed:
			b.Acted++
		case OutcomeDone:
			b.SkippedDone++
		default:
			b.Gone++
		}
	}
	b.Position += len(raw)
	b.Error = ""
	bs.s.m.batchLetters.WithLabelValues(b.Action).Add(float64(len(raw)))
	return bs.save(ctx, b)
}

// watch reads where the letters b requeued stand, counts those back in the
// main topic, and saves b; it returns how many still wait. *pending is
// the letters not back yet: read from the batch's list the first time
// (Delivered is then counted afresh, so a runner resuming the watch
// counts no letter twice), and shrinks as they go back.
func (bs *batches) watch(ctx context.Context, b *Batch, pending *[]string) (int, error) {
	if *pending == nil {
		ids, err := bs.s.rdb.LRange(ctx, bs.key(b.ID, "acted"), 0, -1).Result()
		if err != nil {
			return 0, fmt.Errorf("reading the batch's requeued letters: %w", err)
		}
		seen := make(map[string]bool, len(ids))
		list := make([]string, 0, len(ids))
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				list = append(list, id)
			}
		}
		*pending, b.Delivered = list, 0
	}
	var keep []string
	var next, last time.Time
	delivered := 0
	for lo := 0; lo < len(*pending); lo += 1000 {
		part := (*pending)[lo:min(lo+1000, len(*pending))]
		ds, err := bs.s.dlq.Delivery(ctx, part, b.ID, b.Created)
		if err != nil {
			return 0, err
		}
		for i, d := range ds {
			switch d.State {
			case DeliveryWaiting:
				keep = append(keep, part[i])
				if next.IsZero() || d.Due.Before(next) {
					next = d.Due
				}
				if d.Due.After(last) {
					last = d.Due
				}
			case DeliveryDelivered:
				delivered++
			}
		}
	}
	if keep == nil {
		keep = []string{}
	}
	*pending = keep
	b.Delivered += delivered
	b.Waiting = len(keep)
	b.NextRetry, b.LastRetry = nil, nil
	if len(keep) > 0 {
		b.NextRetry, b.LastRetry = &next, &last
	}
	b.Error = ""
	return len(keep), bs.save(ctx, b)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// finish saves b's final state and logs it.
func (bs *batches) finish(ctx context.Context, b *Batch, log *zap.Logger) {
	now := bs.s.clock.Now()
	b.Finished = &now
	if err := bs.save(ctx, b); err != nil {
		log.Warn("batch end not saved", zap.Error(err))
		return
	}
	log.Info("batch "+b.State, zap.Int("total", b.Total), zap.Int("acted", b.Acted),
		zap.Int("skipped_done", b.SkippedDone), zap.Int("gone", b.Gone), zap.String("cancelled_by", b.CancelledBy))
}

// resumeLoop takes over running batches nobody holds the lease of, every
// batchLease/5 until the server closes.
func (bs *batches) resumeLoop() {
	tick := time.NewTicker(batchLease / 5)
	defer tick.Stop()
	for {
		select {
		case <-bs.ctx.Done():
			return
		case <-tick.C:
		}
		bs.resume(bs.ctx)
	}
}

func (bs *batches) resume(ctx context.Context) {
	ids, err := bs.s.rdb.ZRevRange(ctx, bs.key("index"), 0, batchesListed-1).Result()
	if err != nil {
		return
	}
	for _, id := range ids {
		bs.mu.Lock()
		mine := bs.running[id]
		bs.mu.Unlock()
		if mine {
			continue
		}
		b, err := bs.get(ctx, id)
		if err != nil || b.State != BatchRunning || b.Runner != "" {
			continue
		}
		ok, err := bs.s.rdb.SetNX(ctx, bs.key(id, "lease"), bs.owner, batchLease).Result()
		if err != nil || !ok {
			continue
		}
		bs.s.log.Info("batch taken over", zap.String("batch", id), zap.Int("position", b.Position), zap.Int("total", b.Total))
		bs.launch(&b)
	}
}

// get reads one batch, its runner included.
func (bs *batches) get(ctx context.Context, id string) (Batch, error) {
	pipe := bs.s.rdb.Pipeline()
	data := pipe.Get(ctx, bs.key(id))
	runner := pipe.Get(ctx, bs.key(id, "lease"))
	_, err := pipe.Exec(ctx)
	if errors.Is(data.Err(), redis.Nil) {
		return Batch{}, ErrNotFound
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return Batch{}, err
	}
	var b Batch
	if err := json.Unmarshal([]byte(data.Val()), &b); err != nil {
		return Batch{}, fmt.Errorf("batch %s: %w", id, err)
	}
	if b.State == BatchRunning {
		b.Runner = runner.Val()
	}
	return b, nil
}

// list returns the newest batches first.
func (bs *batches) list(ctx context.Context) ([]Batch, error) {
	ids, err := bs.s.rdb.ZRevRange(ctx, bs.key("index"), 0, batchesListed-1).Result()
	if err != nil {
		return nil, err
	}
	out := []Batch{}
	for _, id := range ids {
		b, err := bs.get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // expired
		}
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// requestCancel asks b's runner to stop; a batch nobody runs is cancelled
// here and now.
func (bs *batches) requestCancel(ctx context.Context, id, who string) (Batch, error) {
	b, err := bs.get(ctx, id)
	if err != nil {
		return Batch{}, err
	}
	if b.State != BatchRunning {
		return Batch{}, fmt.Errorf("%w: batch is %s", ErrConflict, b.State)
	}
	if err := bs.s.rdb.Set(ctx, bs.key(id, "cancel"), who, batchKeep).Err(); err != nil {
		return Batch{}, err
	}
	if ok, err := bs.s.rdb.SetNX(ctx, bs.key(id, "lease"), bs.owner, batchLease).Result(); err == nil && ok {
		b.State, b.CancelledBy, b.Runner = BatchCancelled, who, ""
		now := bs.s.clock.Now()
		b.Finished = &now
		err := bs.save(ctx, &b)
		_ = releaseScript.Run(ctx, bs.s.rdb, []string{bs.key(id, "lease")}, bs.owner).Err()
		return b, err
	}
	return b, nil
}

// close stops this server's runners (their batches are resumed elsewhere)
// and waits for them.
func (bs *batches) close() {
	bs.cancel()
	bs.wg.Wait()
}

// UserCount is one user's share of a selection.
type UserCount struct {
	User  string `json:"user"`
	Count int    `json:"count"`
}

// topUsers counts ls by user, the n biggest first, and the number of users.
func topUsers(ls []Letter, n int) ([]UserCount, int) {
	counts := map[string]int{}
	for _, l := range ls {
		counts[l.User]++
	}
	out := make([]UserCount, 0, len(counts))
	for u, c := range counts {
		out = append(out, UserCount{User: u, Count: c})
	}
	slices.SortFunc(out, func(a, b UserCount) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return strings.Compare(a.User, b.User)
	})
	return out[:min(n, len(out))], len(counts)
}
