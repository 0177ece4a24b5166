package dlq

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/go-redsync/redsync/v4"
	goredispool "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// EventSink records index events in the DLQ topic; *Producer is one.
type EventSink interface {
	Send(dl *chatmsg.DeadLetter, done func(error))
}

// SchedulerConfig configures the delayed-retry scheduler.
type SchedulerConfig struct {
	Kafka     config.Kafka     // brokers and the main topic retries go to
	Recovery  config.Recovery  // scan_interval, lock_ttl, base_delay
	RateLimit config.RateLimit // paces re-injection inside a user's limit
	Prefix    string           // Redis key prefix, e.g. "kfpipe:"
	// Batch is how many due entries one scan takes at most (default 500).
	Batch int
}

// Scheduler sends due retries back to the main topic. Only
// the replica holding the Redis lock scans; each due entry is also claimed
// with a lease in Redis, so even two scanners never send it twice, and an
// entry claimed by a scheduler that died is due again when the lease ends.
// The index is updated only after Kafka acknowledged the retry: a crash in
// between sends it again later (the consumer's dedup absorbs that), it is
// never lost.
type Scheduler struct {
	cfg    SchedulerConfig
	idx    *Index
	policy *Policy
	clock  Clock
	log    *zap.Logger
	events EventSink
	mutex  *redsync.Mutex

	// tx is the transactional producer of re-injections: a retry and its
	// "retried" event go to the main and DLQ topics in one transaction,
	// so a scheduler killed after the commit and before the index learnt
	// of it cannot send the letter again — the event is in the DLQ topic
	// and the index applies it. Made on the first scan that sends; closed
	// when the lock is lost or after a fatal error (another scheduler
	// fenced it). One transactional.id per DLQ group: a new lock holder's
	// InitTransactions aborts whatever a dead holder left open.
	txMu    sync.Mutex
	tx      *kafka.Producer
	txDrain sync.WaitGroup
	// catchUp is set when the index may lag behind committed
	// transactions (a new lock holder, a failed index update): the next
	// scan first waits until the DLQ consumer group has read the DLQ
	// topic to its end.
	catchUp atomic.Bool
	lease   time.Duration
	m       schedulerMetrics

	paceMu sync.Mutex
	pace   map[string]*paceWindow

	stop      chan struct{}
	loopWG    sync.WaitGroup
	closeOnce sync.Once
}

type paceWindow struct {
	start time.Time
	n     int
}

type schedulerMetrics struct {
	recovered     prometheus.Counter
	retryErrors   prometheus.Counter
	paced         prometheus.Counter
	heldForOrder  prometheus.Counter
	reviewPending prometheus.Gauge
}

func newReviewGauge(reg prometheus.Registerer) prometheus.Gauge {
	return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kfpipe_dlq_manual_review_pending", Help: "Dead letters waiting for manual review."}))
}

// NewScheduler builds a scheduler; Start runs it. Options: WithLogger,
// WithRegisterer, WithClock, WithEventSink.
func NewScheduler(cfg SchedulerConfig, rdb redis.UniversalClient, idx *Index, policy *Policy, opts ...Option) (*Scheduler, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	o := buildOptions(opts)
	rs := redsync.New(goredispool.NewPool(rdb))
	s := &Scheduler{
		cfg:    cfg,
		idx:    idx,
		policy: policy,
		clock:  o.clock,
		log:    o.log.Named("dlq-scheduler"),
		events: o.events,
		mutex: rs.NewMutex(cfg.Prefix+"lock:dlq:scheduler",
			redsync.WithExpiry(cfg.Recovery.LockTTL), redsync.WithTries(1)),
		// Long enough for Kafka to answer (its delivery timeout) before
		// the entry may be handed out again.
		lease: cfg.Kafka.Producer.DeliveryTimeout + cfg.Recovery.LockTTL,
		pace:  map[string]*paceWindow{},
		stop:  make(chan struct{}),
		m: schedulerMetrics{
			recovered: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_messages_recovered_total", Help: "Dead letters re-injected into the main topic (acknowledged)."})),
			retryErrors: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_retry_errors_total", Help: "Re-injections the main topic did not acknowledge."})),
			paced: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_retries_paced_total", Help: "Due retries postponed to keep a user inside the rate limit."})),
			heldForOrder: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_retries_held_for_order_total",
				Help: "Due retries held until an older letter of the same user is re-injected (each user's order)."})),
			reviewPending: newReviewGauge(o.reg),
		},
	}
	if s.lease < time.Second {
		s.lease = time.Second
	}
	s.catchUp.Store(true)
	return s, nil
}

// transactionalID is the scheduler's, shared by every replica of the DLQ
// group: at most one of them (the lock holder) sends at a time, and a new
// holder fences a paused old one.
func (c SchedulerConfig) transactionalID() string { return c.Kafka.Consumer.GroupID + "-scheduler" }

// producer returns the transactional producer, making it (and running
// InitTransactions, which aborts what a dead holder left open) if needed.
func (s *Scheduler) producer(ctx context.Context) (*kafka.Producer, error) {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	if s.tx != nil {
		return s.tx, nil
	}
	cm := kafkaclient.Producer(s.cfg.Kafka)
	_ = cm.SetKey("transactional.id", s.cfg.transactionalID())
	kp, err := kafka.NewProducer(cm)
	if err != nil {
		return nil, fmt.Errorf("dlq retry producer: %w", err)
	}
	s.txDrain.Add(1)
	go func() {
		defer s.txDrain.Done()
		// No delivery reports to settle: the transaction's commit is the
		// outcome (a fatal error fails it, and the producer is dropped).
		kafkaclient.DrainEvents(kp.Events(), kafkaclient.Events[struct{}]{
			Log: s.log, ErrorLevel: zap.DebugLevel, Name: "retry producer"})
	}()
	ictx, cancel := context.WithTimeout(ctx, s.cfg.Kafka.Producer.DeliveryTimeout+10*time.Second)
	defer cancel()
	if err := kp.InitTransactions(ictx); err != nil {
		kp.Close()
		return nil, fmt.Errorf("dlq retry producer: init transactions: %w", err)
	}
	s.tx = kp
	return kp, nil
}

// dropProducer closes the transactional producer (lock lost, fatal
// error); the next scan makes a new one.
func (s *Scheduler) dropProducer() {
	s.txMu.Lock()
	kp := s.tx
	s.tx = nil
	s.txMu.Unlock()
	if kp != nil {
		kp.Close()
	}
}

// waitIndexed waits until the DLQ consumer group has committed, on every
// partition of the DLQ topic, the high watermark seen now — it commits
// only what it indexed, so every "retried" event a killed scheduler
// committed is in the index — or until twice the claim lease passed
// (logged; the lease still holds such letters back for as long).
func (s *Scheduler) waitIndexed(ctx context.Context) error {
	topic := s.cfg.Kafka.Topics.DLQ.Name
	kc, err := kafka.NewConsumer(kafkaclient.Consumer(s.cfg.Kafka, s.cfg.Kafka.Consumer.GroupID))
	if err != nil {
		return fmt.Errorf("dlq index catch-up: %w", err)
	}
	defer kc.Close()
	md, err := kc.GetMetadata(&topic, false, 10000)
	if err != nil {
		return fmt.Errorf("dlq index catch-up: metadata: %w", err)
	}
	high := map[int32]int64{}
	var tps []kafka.TopicPartition
	for _, p := range md.Topics[topic].Partitions {
		lo, hi, err := kc.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			return fmt.Errorf("dlq index catch-up: watermarks: %w", err)
		}
		if hi > lo {
			high[p.ID] = hi
			tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p.ID})
		}
	}
	deadline := time.Now().Add(2 * s.lease)
	for len(tps) > 0 {
		got, err := kc.Committed(tps, 10000)
		if err == nil {
			tps = tps[:0]
			for _, tp := range got {
				if int64(tp.Offset) < high[tp.Partition] {
					tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: tp.Partition})
				}
			}
			if len(tps) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.log.Warn("the DLQ index did not catch up with the DLQ topic; scanning anyway (claim leases hold back letters a dead scheduler sent)",
				zap.Int("partitions_behind", len(tps)), zap.Error(err))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// Start runs the scan loop until Close.
func (s *Scheduler) Start() {
	s.loopWG.Add(1)
	go s.loop()
}

func (s *Scheduler) loop() {
	defer s.loopWG.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	t := time.NewTicker(s.cfg.Recovery.ScanInterval)
	defer t.Stop()
	held := false
	defer func() {
		if held {
			uctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = s.mutex.UnlockContext(uctx)
			c()
		}
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if held {
			if ok, err := s.mutex.ExtendContext(ctx); !ok || err != nil {
				held = false
				s.dropProducer()
				s.log.Warn("scheduler lock lost", zap.Error(err))
			}
		}
		if !held {
			if err := s.mutex.TryLockContext(ctx); err != nil {
				continue // another replica schedules
			}
			held = true
			s.catchUp.Store(true)
			s.log.Info("scheduler lock acquired")
		}
		if _, err := s.ScanOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("scheduler scan failed", zap.Error(err))
		}
	}
}

// ScanOnce sends every entry due by now (up to Batch) and returns how
// many it re-injected. The loop calls it while holding the lock; calling
// it without the lock is still safe (claims are leased, and the
// transactional producer fences a second sender).
//
// The retries of one scan and their "retried" events go to the main and
// DLQ topics in one Kafka transaction: either every one of them is
// committed (and the index learns of it, from this scan or, if the
// scheduler dies first, from the events in the DLQ topic) or none is
// visible to the consumers (read_committed) and the letters stay due.
func (s *Scheduler) ScanOnce(ctx context.Context) (int, error) {
	if s.catchUp.Load() {
		if err := s.waitIndexed(ctx); err != nil {
			return 0, err
		}
		s.catchUp.Store(false)
	}
	now := s.clock.Now()
	items, err := s.idx.claim(ctx, now, s.cfg.Batch, s.lease)
	if err != nil {
		return 0, err
	}
	// Claimed in due-time order; letters due together (a batch retry,
	// equal backoffs) go back in their messages' order, each user's in
	// the order the user sent them.
	SortBySource(items, func(c claimed) *chatmsg.DeadLetter { return c.dl })
	items, errs := s.inUserOrder(ctx, items)
	type inflight struct {
		c        claimed
		st       RecoveryStrategy
		attempts int
		rec      *RetryRecord
	}
	sent := make([]inflight, 0, len(items))
	paced := 0
	blocks := map[string]time.Time{}
	for _, c := range items {
		st := s.policy.Strategy(c.dl.Reason)
		if until, held := s.heldByBlock(ctx, st, c.dl, now, blocks); held {
			// Refused again at once if sent now: it waits for the block,
			// released from an operator's batch that requeued it (one
			// who unblocks the user then retries it at once).
			if err := s.idx.release(ctx, c.id, until); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if at, ok := s.admit(c.dl, now); !ok {
			// Postponed to the next window of the user, in order.
			paced++
			s.m.paced.Inc()
			if err := s.idx.reschedule(ctx, c.id, at.Add(time.Duration(paced)*time.Millisecond)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		rec, err := st.PrepareRetry(retryBudget(c))
		if err != nil {
			st.OnFailure(c.dl, err)
			if err := s.idx.MoveToReview(ctx, c.id); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		sent = append(sent, inflight{c: c, st: st, attempts: c.attempts + 1, rec: rec})
	}
	if len(sent) == 0 {
		return 0, errors.Join(errs...)
	}
	fail := func(err error) (int, error) {
		s.m.retryErrors.Add(float64(len(sent)))
		at := s.clock.Now().Add(s.cfg.Recovery.BaseDelay)
		for _, in := range sent {
			in.st.OnFailure(in.c.dl, err)
			errs = append(errs, s.idx.reschedule(ctx, in.c.id, at))
		}
		return 0, errors.Join(append(errs, fmt.Errorf("dlq retry transaction: %w", err))...)
	}
	kp, err := s.producer(ctx)
	if err != nil {
		return fail(err)
	}
	if err := kp.BeginTransaction(); err != nil {
		s.dropProducer()
		return fail(err)
	}
	dlqTopic := s.cfg.Kafka.Topics.DLQ.Name
	for _, in := range sent {
		msg := &kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &s.cfg.Kafka.Topics.Main.Name, Partition: kafka.PartitionAny},
			Key:            in.rec.Key,
			Value:          in.rec.Value,
			Headers:        make([]kafka.Header, len(in.rec.Headers)),
		}
		for i, h := range in.rec.Headers {
			msg.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
		ev := s.retriedEvent(in.c, in.attempts)
		body, err := Encode(ev)
		if err == nil {
			err = kp.Produce(msg, nil)
		}
		if err == nil {
			err = kp.Produce(dlqRecord(&dlqTopic, ev, body, nil), nil)
		}
		if err != nil {
			s.abort(ctx, kp)
			return fail(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Kafka.Producer.DeliveryTimeout+5*time.Second)
	err = kp.CommitTransaction(cctx)
	cancel()
	if err != nil {
		// A retriable commit error may still commit on a retry; anything
		// else aborts. Either way the letters' claims are not marked: if
		// the commit did happen, the events in the DLQ topic mark them.
		if ke, ok := err.(kafka.Error); ok && ke.IsRetriable() {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.Kafka.Producer.DeliveryTimeout+5*time.Second)
			err2 := kp.CommitTransaction(cctx)
			cancel()
			if err2 == nil {
				err = nil
			}
		}
		if err != nil {
			s.abort(ctx, kp)
			s.catchUp.Store(true) // a commit of unknown outcome
			return fail(err)
		}
	}
	// Committed: the retries are on the main topic.
	ok := 0
	for _, in := range sent {
		ok++
		s.m.recovered.Inc()
		in.st.OnSuccess(in.c.dl)
		if _, err := s.idx.MarkRetried(ctx, in.c.id, in.attempts); err != nil {
			// The retried event in the DLQ topic marks it; until then its
			// claim lease holds it back, and the next scan waits for the
			// index to catch up.
			s.catchUp.Store(true)
			errs = append(errs, err)
		}
	}
	if n, err := s.idx.reviewCount(ctx); err == nil {
		s.m.reviewPending.Set(float64(n))
	}
	return ok, errors.Join(errs...)
}

// abort aborts the open transaction; a producer that cannot abort (fenced,
// fatal) is dropped.
func (s *Scheduler) abort(ctx context.Context, kp *kafka.Producer) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.Kafka.Producer.DeliveryTimeout+5*time.Second)
	defer cancel()
	if err := kp.AbortTransaction(actx); err != nil {
		s.log.Warn("abort of the retry transaction failed; the producer is made anew", zap.Error(err))
		s.dropProducer()
	}
}

// retriedEvent is the "retried" event of c's attempts-th re-injection,
// keyed like the dead letter so it follows it in the same partition; a
// Rebuild replays it.
func (s *Scheduler) retriedEvent(c claimed, attempts int) *chatmsg.DeadLetter {
	return &chatmsg.DeadLetter{ID: c.id, Event: EventRetried, Attempts: attempts, Reason: c.dl.Reason,
		UserID: c.dl.UserID, OriginalKey: c.dl.OriginalKey, FailureTime: s.clock.Now()}
}

// heldByBlock reports whether a letter the limiter refused (a reason whose
// recovery waits for the block: rate_limited, user_blocked) belongs to a
// user who is blocked now, and until when (a second past the block's end).
// The consumer would refuse it again at once (user_blocked) and the DLQ
// would grow by a letter per retry; this happens when the letter was
// placed before its user's block was known (the refusals that led to the
// block), and when an operator retries a blocked user's letters without
// unblocking the user. blocks caches one scan's lookups per user; a failed
// lookup lets the letter go (the consumer still judges it).
func (s *Scheduler) heldByBlock(ctx context.Context, st RecoveryStrategy, dl *chatmsg.DeadLetter, now time.Time,
	blocks map[string]time.Time) (time.Time, bool) {
	b, ok := st.(*blocked)
	if !ok || b.lookup == nil || dl.UserID == "" {
		return time.Time{}, false
	}
	until, seen := blocks[dl.UserID]
	if !seen {
		u, isBlocked, err := b.lookup.BlockedUntil(ctx, dl.UserID)
		if err != nil {
			s.log.Warn("block lookup failed; re-injecting", zap.String("user_id", dl.UserID), zap.Error(err))
		} else if isBlocked {
			until = u
		}
		blocks[dl.UserID] = until
	}
	if !until.After(now) {
		return time.Time{}, false
	}
	return until.Add(time.Second), true
}

// admit applies the pacing rule: a user's retries, whatever their reason,
// are re-injected at most max_messages/2 per window of the user's group
// (the scheduler's windows, one per user, from the user's first retry),
// the rest postponed to the user's next window in their order. A
// recovery thus comes back at a person's pace — 20 letters under normal
// (30 a minute): 15 now, 5 a minute later — and leaves half of the window
// to what the user sends meanwhile. The consumer does not count a retry
// whose reason is past the limiter (the reason table's PastLimiter); one
// the limiter or the breaker refused it judges at its re-injection time,
// which this pacing keeps inside the limit. When refused it returns the time the user's next window starts.
func (s *Scheduler) admit(dl *chatmsg.DeadLetter, now time.Time) (time.Time, bool) {
	if dl.UserID == "" {
		return time.Time{}, true
	}
	allow, window, paced := RetryPace(s.cfg.RateLimit, dl.UserGroup)
	if !paced {
		return time.Time{}, true
	}
	s.paceMu.Lock()
	defer s.paceMu.Unlock()
	w, ok := s.pace[dl.UserID]
	if !ok || now.Sub(w.start) >= window {
		if len(s.pace) > 100000 {
			for u, pw := range s.pace { // forget windows that ended
				if now.Sub(pw.start) >= window {
					delete(s.pace, u)
				}
			}
		}
		w = &paceWindow{start: now}
		s.pace[dl.UserID] = w
	}
	if w.n >= allow {
		return w.start.Add(window), false
	}
	w.n++
	return time.Time{}, true
}

// RetryPace is the pacing rule admit applies to a user of group (the
// default group when group is unknown): at most allow retries a window.
// paced is false when the rate limiter is off (retries are not paced).
// The console's batch estimate reads the same rule.
func RetryPace(rl config.RateLimit, group string) (allow int, window time.Duration, paced bool) {
	if !rl.Enabled {
		return 0, 0, false
	}
	g, ok := rl.Groups[group]
	if !ok {
		g = rl.Groups[rl.DefaultGroup]
	}
	window = time.Duration(g.WindowSeconds * float64(time.Second))
	if window <= 0 {
		return 0, 0, false
	}
	return max(g.MaxMessages/2, 1), window, true
}

// Close stops the loop, releases the lock and closes the retry producer
// after flushing what it still holds (until ctx's deadline).
func (s *Scheduler) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.stop)
		// A scan may be inside a Kafka call that does not see the
		// cancellation (a transaction's commit or init waits for its own
		// timeout): shutdown waits for it only until ctx's deadline. What
		// it leaves is safe: its claims are leased, an open transaction
		// is aborted by the next holder's InitTransactions.
		looped := make(chan struct{})
		go func() {
			s.loopWG.Wait()
			close(looped)
		}()
		select {
		case <-looped:
		case <-ctx.Done():
			var stacks strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			s.log.Warn("scheduler: a scan was still running at the shutdown deadline; left to the process exit (its claims are leased)",
				zap.String("goroutines", stacks.String()))
			return
		}
		s.dropProducer()
		s.txDrain.Wait()
	})
	return nil
}

// retryBudget is the letter a retry is prepared from. An operator's batch
// retry gives the letter a fresh budget: its re-injection counts as the
// first retry, so a refusal on the way back (the user's breaker still
// open, the limiter) dead-letters it as recoverable and the scheduler
// tries again after its backoff, instead of sending it straight back to
// review because the retries it spent before the operator acted are gone.
func retryBudget(c claimed) *chatmsg.DeadLetter {
	if c.batch == "" || c.dl.RetryCount == 0 {
		return c.dl
	}
	fresh := *c.dl
	fresh.RetryCount = 0
	return &fresh
}
