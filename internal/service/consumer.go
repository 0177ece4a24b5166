package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/outcome"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/state"
)

// partitionState adapts state.Store to consumer.State.
type partitionState struct {
	s     *state.Store
	look  *state.Looker
	flush time.Duration
	batch int
}

var _ consumer.State = partitionState{}

// Acquire implements consumer.State.
func (ps partitionState) Acquire(ctx context.Context, topic string, partition int32) (consumer.Lease, error) {
	l, err := ps.s.Acquire(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	return &partitionLease{l: l, m: l.NewMarker(ps.flush, ps.batch), look: ps.look}, nil
}

// partitionLease adapts state.Lease and its Marker to consumer.Lease.
type partitionLease struct {
	l    *state.Lease
	m    *state.Marker
	look *state.Looker // the consumer's look-ups, batched across partitions
}

func (pl *partitionLease) Token() int64          { return pl.l.Token() }
func (pl *partitionLease) Lost() <-chan struct{} { return pl.l.Lost() }

// Deadline is the lease's local deadline: the consumer starts no attempt
// and no reply past it (minus its margin).
func (pl *partitionLease) Deadline() time.Time { return pl.l.Deadline() }

// Lapse sends the marks still queued, then stops renewing without giving
// the lease back (work under it may still run).
func (pl *partitionLease) Lapse() {
	pl.m.Close()
	pl.l.Lapse()
}

func stateItems(items []handler.StateItem) []state.Item {
	out := make([]state.Item, len(items))
	for i, it := range items {
		out[i] = state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}
	}
	return out
}

// Seen implements consumer.Lease: a message an old store's owner still
// holds (while the old keys are read) is not done yet, and not fresh
// either: the look-up fails and is made again.
func (pl *partitionLease) Seen(ctx context.Context, items []handler.StateItem) ([]bool, error) {
	st, err := pl.look.Look(ctx, pl.l, stateItems(items))
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(st))
	for i, v := range st {
		if v == state.Held {
			return nil, fmt.Errorf("%s is held by a consumer of the old dedup store", items[i].Key)
		}
		out[i] = v == state.Done
	}
	return out, nil
}

// Mark implements consumer.Lease. A mark the marker could not take (it
// was closed: the lease was lost or given back) is sent on its own, again
// and again for up to markRetryFor: an effect that happened is recorded
// whoever owns the partition.
func (pl *partitionLease) Mark(it handler.StateItem, offset int64, done func(bool)) {
	si := state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}
	pl.m.Add(si, offset, func(err error) {
		if err == nil || errors.Is(err, state.ErrFenced) {
			done(true)
			return
		}
		go func() {
			backoff := 50 * time.Millisecond
			for start := time.Now(); time.Since(start) < markRetryFor; {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := pl.l.Mark(ctx, offset, []state.Item{si})
				cancel()
				if err == nil || errors.Is(err, state.ErrFenced) {
					done(true)
					return
				}
				time.Sleep(backoff)
				backoff = min(2*backoff, 2*time.Second)
			}
			done(false)
		}()
	})
}

// Admit implements consumer.Admitter: the partition's marker holds new
// attempts while its marks lag or cannot be written.
func (pl *partitionLease) Admit(ctx context.Context) error { return pl.m.Admit(ctx) }

// Replied implements handler.ReplyLog.
func (pl *partitionLease) Replied(ctx context.Context, it handler.StateItem) (string, bool, error) {
	return pl.l.Replied(ctx, state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User})
}

// RecordReply implements handler.ReplyLog: the record replaces the
// reply's claim.
func (pl *partitionLease) RecordReply(ctx context.Context, it handler.StateItem, record string) error {
	return pl.l.RecordClaimedReply(ctx, state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}, record)
}

// ClaimReply implements handler.ReplyClaimer.
func (pl *partitionLease) ClaimReply(ctx context.Context, it handler.StateItem, hold time.Duration) (string, bool, time.Duration, error) {
	return pl.l.ClaimReply(ctx, state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}, hold)
}

// topicPartitions tells the state store a topic's partition count from
// Kafka's metadata (nil without an admin client), so that it records the
// counts its marks were written under (issue 43: partitions added).
func topicPartitions(admin *kafka.AdminClient) func(ctx context.Context, topic string) (int, error) {
	if admin == nil {
		return nil
	}
	return func(ctx context.Context, topic string) (int, error) {
		ms := 5000
		if dl, ok := ctx.Deadline(); ok {
			ms = max(1, min(ms, int(time.Until(dl).Milliseconds())))
		}
		md, err := admin.GetMetadata(&topic, false, ms)
		if err != nil {
			return 0, err
		}
		tm, ok := md.Topics[topic]
		if !ok || tm.Error.Code() != kafka.ErrNoError {
			return 0, fmt.Errorf("metadata of %s: %v", topic, tm.Error)
		}
		return len(tm.Partitions), nil
	}
}

// markRetryFor is how long a done mark the lease's marker could not take
// is retried (through a Redis outage).
const markRetryFor = 10 * time.Minute

// Release implements consumer.Lease.
func (pl *partitionLease) Release(ctx context.Context) error {
	pl.m.Close()
	if err := pl.l.Release(ctx); err != nil && !errors.Is(err, state.ErrFenced) {
		return err
	}
	return nil
}

// limiter adapts ratelimit.Limiter to consumer.Limiter.
type limiter struct{ l *ratelimit.Limiter }

func (l limiter) Allow(ctx context.Context, user string, now time.Time) consumer.Verdict {
	d := l.l.Allow(ctx, user, now)
	if d.Allowed {
		return consumer.Verdict{Allowed: true}
	}
	details := fmt.Sprintf("group %s: %d consecutive violations", d.Group, d.Violations)
	switch {
	case d.Permanent:
		details = fmt.Sprintf("group %s: blocked permanently", d.Group)
	case d.NewBlock:
		// The refusal that began the block: the rate-limit card reads
		// why from it.
		details = fmt.Sprintf("group %s: %d consecutive violations: blocked until %s", d.Group, d.Violations,
			d.BlockedUntil.UTC().Format(time.RFC3339))
	case !d.BlockedUntil.IsZero():
		details = fmt.Sprintf("group %s: blocked until %s", d.Group, d.BlockedUntil.UTC().Format(time.RFC3339))
	}
	return consumer.Verdict{Reason: d.Reason, Details: details}
}

var (
	_ consumer.Prefetcher = limiter{}
	_ consumer.Forgetter  = limiter{}
)

// Forget drops user's in-memory limiter state (consumer.Forgetter).
func (l limiter) Forget(user string) { l.l.Forget(user) }

// Prefetch lets the consumer read a polled batch's new users in one round
// trip (consumer.Prefetcher).
func (l limiter) Prefetch(ctx context.Context, users []string, now time.Time) {
	l.l.Prefetch(ctx, users, now)
}

// deadLetters adapts dlq.Producer to consumer.DeadLetters.
type deadLetters struct {
	p    *dlq.Producer
	node string
}

func (d deadLetters) Send(dl *chatmsg.DeadLetter, done func(error)) {
	dl.NodeID = d.node
	d.p.Send(dl, done)
}

// Consumer is a running schedule-consumer.
type Consumer struct {
	C        *consumer.Consumer
	looker   *state.Looker
	limiter  *ratelimit.Limiter
	producer *dlq.Producer
	// outcomes writes the archive's outcome records (nil: archive off).
	outcomes *outcome.Writer
	// stopWatch ends the Redis watch (nil when standby is off);
	// watchDone is closed when it returned.
	stopWatch context.CancelFunc
	watchDone chan struct{}
	// stopStatus ends the status publisher; statusDone is closed when it
	// returned.
	stopStatus context.CancelFunc
	statusDone chan struct{}
}

// ConsumerOption is an engine option StartConsumer passes on (a batch
// consumer's WithBatch): the public package configures the engine through
// this layer, not by importing it.
type ConsumerOption = consumer.Option

// WithBatch makes the engine hand each user's consecutive queued messages
// to the handler together (consumer.WithBatch).
func WithBatch(size int, wait time.Duration) ConsumerOption { return consumer.WithBatch(size, wait) }

// NewHandler returns the built-in handler handler.type names
// (consumer.NewHandler); respond gets the http handler's 2xx answers.
func NewHandler(cfg config.Handler, log *zap.Logger, respond func(ctx context.Context, body []byte) error) (handler.Handler, error) {
	return consumer.NewHandler(cfg, log, respond)
}

// StartConsumer starts the schedule-consumer's parts on base's clients
// with handler h (nil: the one selected by handler.type) and the extra
// consumer options (a batch consumer's).
func StartConsumer(ctx context.Context, cfg *config.Consumer, base *daemon.Base, h handler.Handler, extra ...consumer.Option) (*Consumer, error) {
	log, reg := base.Log, base.Registry
	logConsumerSettings(log, cfg)
	prefix := cfg.Redis.KeyPrefix
	if h == nil {
		var err error
		if h, err = consumer.NewHandler(cfg.Handler, log, nil); err != nil {
			return nil, err
		}
	}
	var legacy *state.Legacy
	if cfg.Dedup.Legacy == "read" {
		// For one dedup.ttl after the switch: the old stores' marks
		// (docs/operations.md, "Switching to the per-partition store").
		legacy = &state.Legacy{Prefix: sources.DedupPrefix(prefix), Claims: true, Leases: true}
	}
	st, err := state.New(ctx, state.Config{Client: base.Redis, KeyPrefix: prefix, Owner: nodeName(),
		Lease: cfg.Dedup.Lease, TTL: cfg.Dedup.TTL, Buckets: cfg.Dedup.Buckets, Legacy: legacy,
		Partitions: topicPartitions(base.Admin)})
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	s := &Consumer{looker: st.NewLooker(cfg.Processor.PipelineMaxBatched)}
	opts := []consumer.Option{consumer.WithLogger(log), consumer.WithRegisterer(reg),
		consumer.WithState(partitionState{s: st, look: s.looker, flush: max(cfg.Processor.PipelineFlush, time.Millisecond), batch: cfg.Processor.PipelineMaxBatched}),
		consumer.WithLimitMemory(st)}
	if cfg.RateLimit.Enabled {
		s.limiter, err = ratelimit.New(cfg.RateLimit, ratelimit.NewStore(base.Redis, prefix),
			append(rulesOption(cfg.RateLimit, base), ratelimit.WithLogger(log), ratelimit.WithRegisterer(reg))...)
		if err != nil {
			_ = s.close(ctx)
			return nil, fmt.Errorf("rate limiter: %w", err)
		}
		opts = append(opts, consumer.WithLimiter(limiter{s.limiter}))
	}
	breakers, err := ratelimit.NewBreakers(cfg.Breaker, ratelimit.WithLogger(log), ratelimit.WithRegisterer(reg))
	if err != nil {
		_ = s.close(ctx)
		return nil, fmt.Errorf("breakers: %w", err)
	}
	opts = append(opts, consumer.WithBreaker(breakers))
	s.producer, err = dlq.NewProducer(dlq.ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ}, dlq.WithLogger(log), dlq.WithRegisterer(reg))
	if err != nil {
		_ = s.close(ctx)
		return nil, fmt.Errorf("dlq producer: %w", err)
	}
	if h, s.outcomes, err = recordOutcomes(ctx, cfg, base, h); err != nil {
		_ = s.close(ctx)
		return nil, err
	}
	s.C, err = consumer.New(*cfg, h, deadLetters{p: s.producer, node: nodeName()}, append(opts, extra...)...)
	if err != nil {
		_ = s.close(ctx)
		return nil, err
	}
	if base.Ops != nil {
		// Ready stays 200: the node works as designed while it waits.
		base.Ops.AddDetail("outage", s.C.OutageDetail)
		base.Ops.AddDetail("dead_letters", s.C.DeadLetterDetail)
	}
	if err := s.C.Start(); err != nil {
		_ = s.close(ctx)
		return nil, err
	}
	if after := cfg.Processor.StandbyAfterRedisLost; after > 0 {
		if base.Ops != nil {
			base.Ops.AddDetail("standby", s.C.StandbyDetail)
		}
		wctx, cancel := context.WithCancel(context.Background())
		s.stopWatch, s.watchDone = cancel, make(chan struct{})
		go func() {
			defer close(s.watchDone)
			watchRedis(wctx, redisconn.Ping(base.Redis), time.Second, after, s.C.SetStandby)
		}()
	}
	sctx, stop := context.WithCancel(context.Background())
	s.stopStatus, s.statusDone = stop, make(chan struct{})
	var fleetDone chan struct{}
	if base.Fleet != nil {
		fleetDone = make(chan struct{})
		go func() {
			defer close(fleetDone)
			followFleet(sctx, base.Fleet, s.C)
		}()
	}
	go func() {
		defer close(s.statusDone)
		publishNodeStatus(sctx, base.Redis, prefix, base.Registry, log)
		if fleetDone != nil {
			<-fleetDone
		}
	}()
	return s, nil
}

// rulesOption is the limiter's or the rate-limit admin's rules backend
// option: etcd's config center with rate_limit.rules_backend etcd.
func rulesOption(c config.RateLimit, base *daemon.Base) []ratelimit.Option {
	if c.RulesBackend == "etcd" {
		return []ratelimit.Option{ratelimit.WithEtcdRules(base.Coord.Config())}
	}
	return nil
}

// followFleet keeps the consumer's fleet entry current: its partitions
// within a second of a rebalance, its live actors every fleetActorsEvery.
func followFleet(ctx context.Context, self *fleet.Self, c *consumer.Consumer) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastActors time.Time
	for {
		ps := c.Partitions()
		actors := time.Since(lastActors) >= fleetActorsEvery
		m := self.Member()
		if actors || !slices.Equal(ps, m.Partitions) {
			n := m.Actors
			if actors {
				n, lastActors = c.ActiveProcessors(), time.Now()
			}
			uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			self.Update(uctx, func(m *fleet.Member) { m.Partitions, m.Actors = ps, n })
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// fleetActorsEvery is how often a consumer's actor count is written to
// its fleet entry (partitions are written on every change).
const fleetActorsEvery = 10 * time.Second

// watchRedis pings Redis every interval; once no ping has succeeded for
// after, it calls standby(true, why), and standby(false, "") at the next
// success. It returns when ctx ends. A ping runs on a goroutine of its own
// and the clock runs on without it: one that does not come back counts as
// failing (go-redis can wait on a new connection to a blackholed Redis well
// past the ping's context), and no second one is started meanwhile.
func watchRedis(ctx context.Context, ping func(context.Context) error, interval, after time.Duration, standby func(bool, string)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	answers := make(chan error, 1) // the ping goroutine never blocks on it
	lastOK, on, pinging := time.Now(), false, false
	var lastErr error
	for {
		if !pinging {
			pinging = true
			go func() {
				pctx, cancel := context.WithTimeout(ctx, interval)
				defer cancel()
				answers <- ping(pctx)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case err := <-answers:
			pinging = false
			if err == nil {
				lastOK = time.Now()
				if on {
					on = false
					standby(false, "")
				}
			} else {
				lastErr = err
			}
			select { // one ping per interval
			case <-ctx.Done():
				return
			case <-t.C:
			}
		case <-t.C:
		}
		if !on && time.Since(lastOK) >= after {
			on = true
			why := "a ping not answered"
			if !pinging && lastErr != nil {
				why = lastErr.Error()
			}
			standby(true, fmt.Sprintf("Redis unreachable for %s (processor.standby_after_redis_lost %s): %s",
				time.Since(lastOK).Round(time.Second), after, why))
		}
	}
}

// Close drains the actors and commits, then closes the DLQ producer (after
// the consumer: its last dead letters must become durable first), the
// limiter and the dedup client.
func (s *Consumer) Close(ctx context.Context) error {
	var errs []error
	if s.stopWatch != nil {
		s.stopWatch()
		<-s.watchDone
	}
	if s.stopStatus != nil {
		s.stopStatus()
		<-s.statusDone
	}
	if s.C != nil {
		errs = append(errs, s.C.Close(ctx))
	}
	return errors.Join(append(errs, s.close(ctx))...)
}

func (s *Consumer) close(ctx context.Context) error {
	var errs []error
	if s.looker != nil {
		s.looker.Close()
	}
	if s.producer != nil {
		errs = append(errs, s.producer.Close(ctx))
	}
	if s.outcomes != nil {
		s.outcomes.Close(ctx)
	}
	if s.limiter != nil {
		errs = append(errs, s.limiter.Close())
	}
	return errors.Join(errs...)
}
