package dlq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/go-redsync/redsync/v4"
	goredispool "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// EventSink records index events in the DLQ topic; *Producer is one.
type EventSink interface {
	Send(dl *DeadLetterMessage, done func(error))
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

// Validate names the first invalid key.
func (c SchedulerConfig) Validate() error {
	switch {
	case c.Kafka.Brokers == "":
		return errors.New("kafka.brokers must not be empty")
	case c.Kafka.Topics.Main.Name == "":
		return errors.New("kafka.topics.main.name must not be empty")
	case c.Recovery.ScanInterval <= 0:
		return fmt.Errorf("recovery.scan_interval must be > 0, got %s", c.Recovery.ScanInterval)
	case c.Recovery.LockTTL < c.Recovery.ScanInterval:
		return fmt.Errorf("recovery.lock_ttl %s must be >= recovery.scan_interval %s", c.Recovery.LockTTL, c.Recovery.ScanInterval)
	case c.Recovery.BaseDelay <= 0:
		return fmt.Errorf("recovery.base_delay must be > 0, got %s", c.Recovery.BaseDelay)
	}
	if c.RateLimit.Enabled {
		if _, ok := c.RateLimit.Groups[c.RateLimit.DefaultGroup]; !ok {
			return fmt.Errorf("rate_limit.default_group must name a group in rate_limit.groups, got %q", c.RateLimit.DefaultGroup)
		}
	}
	return nil
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
	kp     *kafka.Producer
	mutex  *redsync.Mutex
	lease  time.Duration
	m      schedulerMetrics

	paceMu sync.Mutex
	pace   map[string]*paceWindow

	stop      chan struct{}
	loopWG    sync.WaitGroup
	drainWG   sync.WaitGroup
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
	reviewPending prometheus.Gauge
}

func newReviewGauge(reg prometheus.Registerer) prometheus.Gauge {
	return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kfpipe_dlq_manual_review_pending", Help: "Dead letters waiting for manual review."}))
}

// NewScheduler builds a scheduler; Start runs it. Options: WithLogger,
// WithRegisterer, WithClock, WithEventSink.
func NewScheduler(cfg SchedulerConfig, rdb redis.UniversalClient, idx *Index, policy *Policy, opts ...Option) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	o := buildOptions(opts)
	kp, err := kafka.NewProducer(kafkaclient.Producer(cfg.Kafka))
	if err != nil {
		return nil, fmt.Errorf("dlq retry producer: %w", err)
	}
	rs := redsync.New(goredispool.NewPool(rdb))
	s := &Scheduler{
		cfg:    cfg,
		idx:    idx,
		policy: policy,
		clock:  o.clock,
		log:    o.log.Named("dlq-scheduler"),
		events: o.events,
		kp:     kp,
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
			reviewPending: newReviewGauge(o.reg),
		},
	}
	if s.lease < time.Second {
		s.lease = time.Second
	}
	s.drainWG.Add(1)
	go s.drainEvents()
	return s, nil
}

func (s *Scheduler) drainEvents() {
	defer s.drainWG.Done()
	for ev := range s.kp.Events() {
		if e, ok := ev.(kafka.Error); ok {
			s.log.Debug("retry producer error", zap.Error(e))
		}
	}
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
				s.log.Warn("scheduler lock lost", zap.Error(err))
			}
		}
		if !held {
			if err := s.mutex.TryLockContext(ctx); err != nil {
				continue // another replica schedules
			}
			held = true
			s.log.Info("scheduler lock acquired")
		}
		if _, err := s.ScanOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("scheduler scan failed", zap.Error(err))
		}
	}
}

// ScanOnce sends every entry due by now (up to Batch) and returns how
// many Kafka acknowledged. The loop calls it while holding the lock;
// calling it without the lock is still safe (claims are leased).
func (s *Scheduler) ScanOnce(ctx context.Context) (int, error) {
	now := s.clock.Now()
	items, err := s.idx.claim(ctx, now, s.cfg.Batch, s.lease)
	if err != nil {
		return 0, err
	}
	// Claimed in due-time order; letters due together (a batch retry,
	// equal backoffs) go back in their messages' order, each user's in
	// the order the user sent them.
	SortBySource(items, func(c claimed) *DeadLetterMessage { return c.dl })
	type inflight struct {
		c  claimed
		st RecoveryStrategy
	}
	ch := make(chan kafka.Event, len(items))
	sent := make([]inflight, 0, len(items))
	var errs []error
	paced := 0
	for _, c := range items {
		st := s.policy.Strategy(c.dl.Reason)
		if at, ok := s.admit(c.dl, now); !ok {
			// Postponed to the next window of the user, in order.
			paced++
			s.m.paced.Inc()
			if err := s.idx.reschedule(ctx, c.id, at.Add(time.Duration(paced)*time.Millisecond)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		rec, err := st.PrepareRetry(c.dl)
		if err != nil {
			st.OnFailure(c.dl, err)
			if err := s.idx.MoveToReview(ctx, c.id); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		msg := &kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &s.cfg.Kafka.Topics.Main.Name, Partition: kafka.PartitionAny},
			Key:            rec.Key,
			Value:          rec.Value,
			Headers:        make([]kafka.Header, len(rec.Headers)),
			Opaque:         len(sent),
		}
		for i, h := range rec.Headers {
			msg.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
		if err := s.kp.Produce(msg, ch); err != nil {
			st.OnFailure(c.dl, err)
			s.m.retryErrors.Inc()
			errs = append(errs, fmt.Errorf("retry %s: %w", c.id, err),
				s.idx.reschedule(ctx, c.id, now.Add(s.cfg.Recovery.BaseDelay)))
			continue
		}
		sent = append(sent, inflight{c: c, st: st})
	}
	ok := 0
	for range len(sent) {
		var ev kafka.Event
		select {
		case ev = <-ch:
		case <-ctx.Done():
			// Unanswered claims become due again when their lease ends.
			return ok, ctx.Err()
		}
		m, isMsg := ev.(*kafka.Message)
		if !isMsg {
			continue
		}
		in := sent[m.Opaque.(int)]
		if err := m.TopicPartition.Error; err != nil {
			in.st.OnFailure(in.c.dl, err)
			s.m.retryErrors.Inc()
			errs = append(errs, fmt.Errorf("retry %s: %w", in.c.id, err),
				s.idx.reschedule(ctx, in.c.id, s.clock.Now().Add(s.cfg.Recovery.BaseDelay)))
			continue
		}
		// Acknowledged: only now does the index learn about it.
		attempts := in.c.attempts + 1
		if _, err := s.idx.MarkRetried(ctx, in.c.id, attempts); err != nil {
			// The lease runs out and the retry is sent again: a
			// duplicate, never a loss.
			errs = append(errs, err)
			continue
		}
		ok++
		s.m.recovered.Inc()
		in.st.OnSuccess(in.c.dl)
		s.recordEvent(in.c, attempts)
	}
	if n, err := s.idx.reviewCount(ctx); err == nil {
		s.m.reviewPending.Set(float64(n))
	}
	return ok, errors.Join(errs...)
}

// recordEvent writes the "retried" event to the DLQ topic, keyed like the
// dead letter so it follows it in the same partition; a Rebuild replays it.
func (s *Scheduler) recordEvent(c claimed, attempts int) {
	if s.events == nil {
		return
	}
	ev := &DeadLetterMessage{ID: c.id, Event: EventRetried, Attempts: attempts, Reason: c.dl.Reason,
		UserID: c.dl.UserID, OriginalKey: c.dl.OriginalKey, FailureTime: s.clock.Now()}
	s.events.Send(ev, func(err error) {
		if err != nil {
			s.log.Warn("retried event not recorded; a rebuild would retry this dead letter again",
				zap.String("dlq_id", c.id), zap.Error(err))
		}
	})
}

// admit applies the pacing rule: a user's rate_limited and user_blocked
// retries are re-injected at most max_messages/2 per window of the user's
// group, so recovery itself does not trip the limiter again. When refused
// it returns the time the user's next window starts.
func (s *Scheduler) admit(dl *DeadLetterMessage, now time.Time) (time.Time, bool) {
	rl := s.cfg.RateLimit
	if !rl.Enabled || (dl.Reason != ReasonRateLimited && dl.Reason != ReasonUserBlocked) || dl.UserID == "" {
		return time.Time{}, true
	}
	g, ok := rl.Groups[dl.UserGroup]
	if !ok {
		g = rl.Groups[rl.DefaultGroup]
	}
	window := time.Duration(g.WindowSeconds * float64(time.Second))
	allow := max(g.MaxMessages/2, 1)
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

// Close stops the loop, releases the lock and closes the retry producer
// after flushing what it still holds (until ctx's deadline).
func (s *Scheduler) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.loopWG.Wait()
		for s.kp.Len() > 0 && ctx.Err() == nil {
			s.kp.Flush(50)
		}
		s.kp.Close()
		s.drainWG.Wait()
	})
	return nil
}
