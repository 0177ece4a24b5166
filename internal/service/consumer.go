package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/once"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// deduper adapts once.Client to consumer.Deduper.
type deduper struct{ c *once.Client }

func (d deduper) Do(ctx context.Context, key string, ttl time.Duration, f func(context.Context) error) (bool, error) {
	st, err := d.c.DoStatus(ctx, key, ttl, f)
	return st == once.StatusDuplicate, err
}

// ClaimAhead implements consumer.AheadDeduper.
func (d deduper) ClaimAhead(ctx context.Context, keys []string) []consumer.Ticket {
	ts := d.c.ClaimAhead(ctx, keys)
	out := make([]consumer.Ticket, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// DoTicket implements consumer.AheadDeduper.
func (d deduper) DoTicket(ctx context.Context, t consumer.Ticket, ttl time.Duration, f func(context.Context) error, marked, lost func(error)) (bool, error) {
	st, err := d.c.DoTicket(ctx, t.(*once.Ticket), ttl, f, once.Hooks{Marked: marked, Lost: lost})
	return st == once.StatusDuplicate, err
}

// Release implements consumer.AheadDeduper.
func (d deduper) Release(ts []consumer.Ticket) {
	for _, t := range ts {
		d.c.Release(t.(*once.Ticket))
	}
}

// userDeduper adapts once.Users to consumer.UserDeduper.
type userDeduper struct{ u *once.Users }

var _ consumer.UserDeduper = userDeduper{}

// Do is never called: the consumer runs every message of a UserDeduper
// through ClaimUser and DoTicket.
func (userDeduper) Do(context.Context, string, time.Duration, func(context.Context) error) (bool, error) {
	return false, errors.New("dedup: store leases runs messages by user (ClaimUser), not by key")
}

// ClaimAhead is never called for the same reason.
func (userDeduper) ClaimAhead(context.Context, []string) []consumer.Ticket {
	panic("dedup: store leases claims by user (ClaimUser), not by key")
}

// ClaimUser implements consumer.UserDeduper.
func (d userDeduper) ClaimUser(ctx context.Context, user string, items []consumer.DedupItem) []consumer.Ticket {
	in := make([]once.UserItem, len(items))
	for i, it := range items {
		in[i] = once.UserItem{Key: it.Key, SendTime: it.SendTime}
	}
	ts := d.u.ClaimUser(ctx, user, in)
	out := make([]consumer.Ticket, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// DoTicket implements consumer.AheadDeduper (the TTL is the store's).
func (d userDeduper) DoTicket(ctx context.Context, t consumer.Ticket, _ time.Duration, f func(context.Context) error, marked, lost func(error)) (bool, error) {
	st, err := d.u.DoTicket(ctx, t.(*once.UserTicket), f, marked, lost)
	return st == once.StatusDuplicate, err
}

// Release implements consumer.AheadDeduper.
func (d userDeduper) Release(ts []consumer.Ticket) {
	for _, t := range ts {
		d.u.Release(t.(*once.UserTicket))
	}
}

// ReleaseIdle implements consumer.UserDeduper.
func (d userDeduper) ReleaseIdle() { d.u.ReleaseIdle() }

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

func (d deadLetters) Send(cdl *consumer.DeadLetter, done func(error)) {
	headers := make([]dlq.Header, len(cdl.Headers))
	for i, h := range cdl.Headers {
		headers[i] = dlq.Header{Key: h.Key, Value: h.Value}
	}
	dl := dlq.New(dlq.Source{Topic: cdl.Topic, Partition: cdl.Partition, Offset: cdl.Offset, Timestamp: cdl.Timestamp,
		Key: cdl.Key, Value: cdl.Raw, Headers: headers}, dlq.Reason(cdl.Reason), cdl.Details, cdl.FailedAt)
	if cdl.UserID != "" {
		dl.UserID = cdl.UserID
	}
	if !cdl.Recoverable {
		dl.Recoverable, dl.ManualReview = false, true
	}
	dl.NodeID = d.node
	d.p.Send(dl, done)
}

// Consumer is a running schedule-consumer.
type Consumer struct {
	C        *consumer.Consumer
	once     *once.Client
	users    *once.Users // dedup.store: leases
	limiter  *ratelimit.Limiter
	producer *dlq.Producer
	// stopWatch ends the Redis watch (nil when standby is off);
	// watchDone is closed when it returned.
	stopWatch context.CancelFunc
	watchDone chan struct{}
	// stopStatus ends the status publisher; statusDone is closed when it
	// returned.
	stopStatus context.CancelFunc
	statusDone chan struct{}
}

// StartConsumer starts the schedule-consumer's parts on base's clients
// with handler h (nil: the one selected by handler.type).
func StartConsumer(ctx context.Context, cfg *config.Consumer, base *daemon.Base, h consumer.Handler) (*Consumer, error) {
	log, reg := base.Log, base.Registry
	logConsumerSettings(log, cfg)
	prefix := cfg.Redis.KeyPrefix
	if h == nil {
		var err error
		if h, err = consumer.NewHandler(cfg.Handler, log, nil); err != nil {
			return nil, err
		}
	}
	oc, err := once.New(ctx, "schedule-consumer", once.Config{Client: base.Redis, KeyPrefix: dedupPrefix(prefix),
		Lease: cfg.Dedup.Lease, Batch: once.BatchConfig{Enabled: true, FlushInterval: cfg.Processor.PipelineFlush,
			MaxBatch: cfg.Processor.PipelineMaxBatched}}, once.WithLogger(log), once.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("dedup: %w", err)
	}
	s := &Consumer{once: oc}
	waiting := oc.Waiting
	var dd consumer.Deduper = deduper{oc}
	if cfg.Dedup.Store == "leases" {
		legacy, err := once.ParseLegacy(cfg.Dedup.Legacy)
		if err != nil {
			_ = s.close(ctx)
			return nil, fmt.Errorf("dedup.legacy: %w", err)
		}
		s.users, err = once.NewUsers(ctx, "schedule-consumer", once.UsersConfig{Client: base.Redis, KeyPrefix: dedupPrefix(prefix),
			Lease: cfg.Dedup.Lease, TTL: cfg.Dedup.TTL, Legacy: legacy, Batch: once.BatchConfig{FlushInterval: cfg.Processor.PipelineFlush,
				MaxBatch: cfg.Processor.PipelineMaxBatched}}, once.WithLogger(log), once.WithRegisterer(reg))
		if err != nil {
			_ = s.close(ctx)
			return nil, fmt.Errorf("dedup: %w", err)
		}
		dd, waiting = userDeduper{s.users}, s.users.Waiting
	}
	if base.Ops != nil {
		base.Ops.AddDetail("dedup", func() string { return waitDetail(waiting(), cfg.Dedup.Lease) })
	}
	opts := []consumer.Option{consumer.WithLogger(log), consumer.WithRegisterer(reg), consumer.WithDeduper(dd)}
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
	s.C, err = consumer.New(*cfg, h, deadLetters{p: s.producer, node: nodeName()}, opts...)
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
	if s.producer != nil {
		errs = append(errs, s.producer.Close(ctx))
	}
	if s.limiter != nil {
		errs = append(errs, s.limiter.Close())
	}
	if s.users != nil {
		errs = append(errs, s.users.Close(ctx))
	}
	errs = append(errs, s.once.Close())
	return errors.Join(errs...)
}

// waitDetailAfter is how long a message must have waited on another
// owner's claim before /readyz mentions it.
const waitDetailAfter = 5 * time.Second

// waitDetail is the /readyz line for messages waiting on dedup claims held
// by others — after a crash, the dead consumer's claims until their lease
// expires — or "" when no wait is longer than waitDetailAfter. It does not
// make the consumer unready: the waits end by themselves within the lease.
func waitDetail(w once.Waits, lease time.Duration) string {
	if w.Oldest < waitDetailAfter {
		return ""
	}
	return fmt.Sprintf("%d messages waiting on dedup claims held by other owners, oldest %s (key %s); a crashed owner's claims free within dedup.lease (%s)",
		w.Count, w.Oldest.Round(100*time.Millisecond), w.OldestKey, lease)
}

// dedupPrefix is where, under the deployment's Redis key prefix, the
// schedule-consumers keep their dedup marks (the dlq-consumer reads them).
func dedupPrefix(prefix string) string { return prefix + "dedup:" }
