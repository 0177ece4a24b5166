// Package consumer is the schedule-consumer's core: the Kafka consumer-group
// loop, the per-partition offset trackers, the per-user actors and the
// Handler that business code plugs in.
//
// One goroutine owns the confluent-kafka-go consumer (poll, rebalance,
// pause/resume). It reads records in batches of what librdkafka already
// fetched (no waiting for a batch to fill) and routes each by its Kafka
// key — kf-producer keys every record by external_userid, and so do DLQ
// retries — applying the per-user protection in the order of I5: circuit
// breaker, then limiter, then the bounded mailbox. The limiter runs on this
// dispatch goroutine, not in the actor: a refused message then never takes
// a mailbox slot, refusals happen in partition order, and a flood is
// answered with rate_limited rather than filling the mailbox into
// queue_full. Before deciding a batch the dispatcher lets a limiter that
// implements Prefetcher read all the batch's unknown users in one round
// trip. The payload is decoded in the actor, off the dispatch goroutine; a
// record without a key is decoded on the dispatch goroutine to learn its
// user. A record whose payload cannot be decoded (or is too large) goes to
// the DLQ as invalid_message, filed under its key. A payload whose
// external_userid differs from the key is handled normally by the key's
// actor: the key is what partitioned it, so it is what orders it (I4); a
// dead letter of such a record notes both.
//
// Actors dedup, handle with retry, and finish the message (or hand it to
// the DLQ and finish it when the dead letter is durable). Commits come only
// from the offset trackers' contiguous finished prefix (I2): periodically
// from a committer goroutine, and synchronously on revoke and on shutdown.
// No user goroutine ever commits.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/offsets"
)

// Errors returned by New and Close.
var (
	// ErrNoHandler is returned by New when the handler is nil.
	ErrNoHandler = errors.New("consumer: handler is nil")
	// ErrNoDeadLetters is returned by New when the DLQ sender is nil: without
	// it refusals could only be dropped, which I6 forbids.
	ErrNoDeadLetters = errors.New("consumer: dead-letter sender is nil")
	// ErrDrainTimeout is returned by Close when handler attempts still ran
	// after their cancel (the stop's hand-over, bounded like a revoke's):
	// their partitions' leases lapse instead of being given back, and
	// their offsets stay uncommitted.
	ErrDrainTimeout = errors.New("consumer: in-flight messages not finished before close deadline")
)

// Option configures a Consumer.
type Option func(*Consumer)

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(c *Consumer) { c.log = l } }

// WithRegisterer registers the consumer's metrics (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option { return func(c *Consumer) { c.reg = r } }

// WithClock sets the time source (default: the system clock).
func WithClock(clk Clock) Option { return func(c *Consumer) { c.clock = clk } }

// WithState sets the consumer-state store (I3): partition leases and done
// marks. Without one every message is handled, so redeliveries after a
// crash repeat effects.
func WithState(s State) Option { return func(c *Consumer) { c.state = s } }

// WithLimiter sets the per-user rate limiter (default: none).
func WithLimiter(l Limiter) Option { return func(c *Consumer) { c.limiter = l } }

// WithBreaker sets the per-user circuit breaker (default: none).
func WithBreaker(b Breaker) Option { return func(c *Consumer) { c.breaker = b } }

// WithLimitMemory sets where the handler limit is kept across the group's
// members and restarts (default: nowhere; every start begins at
// overload.initial_limit).
func WithLimitMemory(m LimitMemory) Option { return func(c *Consumer) { c.limitMem = m } }

// WithGroup overrides kafka.consumer.group_id.
func WithGroup(g string) Option { return func(c *Consumer) { c.group = g } }

// partition is the consumer's state for one assigned partition.
type partition struct {
	topic   string
	id      int32
	tracker *offsets.Tracker
	// committed is the last committed offset and meta the finished offsets
	// behind it listed in that commit's metadata (guarded by
	// the committer's mu).
	committed int64
	meta      string
	// prior is what the previous owner finished behind its committed
	// offset (from the commit's metadata, ascending): those records are
	// finished at once instead of run again. Set before the partition is
	// shared and never changed; priorAt is the poll goroutine's position.
	prior   []int64
	priorAt int
	// paused is whether the partition is paused in the Kafka client;
	// pausedCap and pausedDead are the reasons it should be: the in-flight
	// cap, a full dead-letter queue. It is paused while either holds
	// (flowControl). All three are owned by the poll goroutine.
	paused     bool
	pausedCap  bool
	pausedDead bool
	// dead holds the partition's dead letters until they are durable; its
	// goroutine lives as long as the assignment (nil only for partitions
	// that unit tests build without a consumer loop).
	dead *deadQueue
	// base is the group's committed offset when the partition was assigned
	// (-1: none committed; -2: not read yet), so that lag shows from the
	// assignment on, before the first message is finished (poll goroutine).
	base int64
	// batched counts the partition's records in the poll goroutine's
	// current batch (owned by it), not yet tracked.
	batched int
	// dropped is set when the partition is revoked or lost: actors skip its
	// remaining messages, which the next owner reads again.
	dropped atomic.Bool
	label   string
	// lease is the partition's hold in the State (nil without one).
	lease *partLease
	// work is its running handler attempts, which the lease covers
	// (own.go).
	work partWork
	// after, when set, is closed when this consumer's earlier hand-over of
	// the same partition ended: its lease keeper waits for it.
	after <-chan struct{}
}

type tpKey struct {
	topic string
	id    int32
}

// Consumer reads the main topic in a consumer group and drives the
// per-user actors. Start begins consuming; Close stops gracefully.
type Consumer struct {
	cfg     config.Consumer
	topic   string
	group   string
	handler Handler
	state   State
	limiter Limiter
	// prefetch is limiter when it implements Prefetcher, else nil.
	prefetch Prefetcher
	breaker  Breaker
	log      *zap.Logger
	reg      prometheus.Registerer
	clock    Clock
	m        *metrics

	kc   *kafka.Consumer
	acts *registry

	// Scratch of the poll goroutine, reused for every batch.
	batch []polled
	envs  []*envelope
	users []string

	// runCtx is handed to handlers and the limiter; cancelled when the
	// consumer gives up waiting (Close deadline, abort).
	runCtx    context.Context
	cancelRun context.CancelFunc

	mu    sync.Mutex // guards parts for readers other than the poll goroutine
	parts map[tpKey]*partition
	// handingOver holds, per revoked partition whose hand-over still runs,
	// a channel closed when it ended (guarded by mu); handOvers counts
	// those hand-overs (Close waits for them).
	handingOver map[tpKey]chan struct{}
	handOvers   sync.WaitGroup

	// commits is the committer (commit.go).
	commits committer

	stopPoll  chan struct{}
	pollDone  chan struct{}
	closing   atomic.Bool
	started   bool
	closeOnce sync.Once
	closeErr  error

	// sb is the standby state: out of the group on purpose (SetStandby).
	sb standby

	// gate holds messages while the downstream fails for many users (nil:
	// off).
	gate *gate
	// down bounds the handler's calls in flight and its retries
	// (downstream.go); limitMem keeps its limit across the group.
	down     *downstream
	limitMem LimitMemory

	// dead is the dead-lettering (deadqueue.go).
	dead *deadLetterer

	// batchMode is WithBatch's (batch.go).
	batchMode batchMode
}

// New creates the consumer and its Kafka client; it does not consume until
// Start.
func New(cfg config.Consumer, h Handler, dlq DeadLetters, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, ErrNoHandler
	}
	if dlq == nil {
		return nil, ErrNoDeadLetters
	}
	c := &Consumer{
		cfg: cfg, topic: cfg.Kafka.Topics.Main.Name, group: cfg.Kafka.Consumer.GroupID,
		handler: h, parts: map[tpKey]*partition{},
		stopPoll: make(chan struct{}), pollDone: make(chan struct{}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	if err := validate(c.topic, c.group); err != nil {
		return nil, err
	}
	c.m = newMetrics(c.reg)
	c.gate = newGate(cfg.Outage, c.clock, c.log, c.reg)
	c.down = newDownstream(cfg, c.clock.Now, c.reg)
	c.prefetch, _ = c.limiter.(Prefetcher)
	c.runCtx, c.cancelRun = context.WithCancel(context.Background())
	c.dead = newDeadLetterer(dlq, c.runCtx, c.commits.finish, cfg.Processor, c.clock, c.log, c.m)
	c.acts = newRegistry(cfg.Processor.MailboxSize, cfg.Processor.IdleTimeout, c.clock, c.process,
		func(d int) { c.m.active.Add(float64(d)) })
	c.acts.onIdle = c.forget
	if c.batchMode.max > 1 {
		c.batchMode.handle = c.processBatch
		c.acts.batch = c.batchMode
	}
	kc, err := kafka.NewConsumer(kafkaclient.Consumer(cfg.Kafka, c.group))
	if err != nil {
		c.cancelRun()
		return nil, fmt.Errorf("consumer: create kafka consumer: %w", err)
	}
	c.kc = kc
	c.commits.init(cfg.Kafka.Consumer, kc, func() []*partition {
		c.mu.Lock()
		defer c.mu.Unlock()
		ps := make([]*partition, 0, len(c.parts))
		for _, p := range c.parts {
			ps = append(ps, p)
		}
		return ps
	}, c.clock, c.log, c.m)
	return c, nil
}

// validate checks what the consumer is started with beyond its
// configuration, which config.Consumer.Validate checked when it was loaded
// (one bound per setting: the bounds live there, not here too).
func validate(topic, group string) error {
	switch {
	case topic == "":
		return errors.New("kafka.topics.main.name must be set")
	case group == "":
		return errors.New("kafka.consumer.group_id must be set")
	}
	return nil
}

// Start subscribes to the main topic and starts the poll and commit
// goroutines.
func (c *Consumer) Start() error {
	if c.started {
		return errors.New("consumer: already started")
	}
	if err := c.kc.SubscribeTopics([]string{c.topic}, c.rebalance); err != nil {
		return fmt.Errorf("consumer: subscribe %s: %w", c.topic, err)
	}
	c.started = true
	c.down.recall(c.runCtx, c.limitMem, c.group, c.log)
	go c.pollLoop()
	c.commits.start()
	return nil
}

// Partitions returns the main-topic partitions the consumer holds now,
// ascending.
func (c *Consumer) Partitions() []int32 {
	c.mu.Lock()
	out := make([]int32, 0, len(c.parts))
	for k := range c.parts {
		out = append(out, k.id)
	}
	c.mu.Unlock()
	slices.Sort(out)
	return out
}

// ActiveProcessors returns the number of live per-user actors.
func (c *Consumer) ActiveProcessors() int { return c.acts.len() }

// InFlight returns the number of messages read but not yet finished.
func (c *Consumer) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.parts {
		n += p.tracker.InFlight()
	}
	return n
}

// maxPollBatch bounds how many already-fetched records the poll goroutine
// takes before dispatching them; it bounds the dispatch delay of the first
// record of a batch and the size of one limiter prefetch.
const maxPollBatch = 256

// maxSendTimeSkew is how far WeChat's send_time may be ahead of the
// record's produce time (the two clocks differ) and still be trusted.
const maxSendTimeSkew = 30 * time.Second

// baseUnknown marks a partition whose committed offset at assignment has
// not been read yet.
const baseUnknown = -2

// Close stops consuming and hands every partition over as a revoke does
// (endAll): no new attempt starts, the running ones are awaited up to
// kafka.consumer.revoke_drain_limit (or ctx's end), then cancelled and
// awaited; it commits the finished prefix synchronously and closes the
// Kafka consumer (leaving the group). Messages not started stay
// uncommitted (the next owner reads them). Close returns ErrDrainTimeout
// only when attempts still ran after their cancel.
func (c *Consumer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown(ctx, false) })
	return c.closeErr
}

// abort simulates a crash for tests: it stops everything without draining
// and without committing anything more.
func (c *Consumer) abort() {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown(context.Background(), true) })
}

func (c *Consumer) shutdown(ctx context.Context, crash bool) error {
	c.closing.Store(true)
	if crash {
		c.commits.abort()
		c.cancelRun()
	}
	var err error
	if c.started {
		close(c.stopPoll)
		<-c.pollDone
		if !crash {
			err = c.endAll(ctx)
		}
	}
	c.cancelRun()
	c.down.stopRemembering()
	c.dead.stopRetries()
	c.stopDeadQueues()
	c.closeActors(errors.Is(err, ErrDrainTimeout))
	if c.started {
		c.commits.shutdown()
		if !crash {
			if cerr := c.commits.commit(nil); groupMovedOn(cerr) {
				// Stopping while the group rebalances (a member joined,
				// left or died): the group refuses this member's commit,
				// and its partitions go to others, who read the finished
				// but uncommitted records again and find them done. A
				// clean stop, not a failure.
				c.log.Warn("final commit refused: the group rebalanced while stopping; "+
					"the next owner reads the uncommitted records again (their effects are done)", zap.Error(cerr))
			} else if cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}
	// Leaving the group serves its last rebalance callbacks. It is bounded:
	// a client whose leave is held back (below) must not keep the daemon
	// from exiting; the group then drops the member at its session timeout.
	closed := make(chan error, 1)
	go func() { closed <- c.kc.Close() }()
	wait := kafkaCloseGrace
	if dl, ok := ctx.Deadline(); ok {
		wait = max(wait, time.Until(dl))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case cerr := <-closed:
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("close kafka consumer: %w", cerr))
		}
	case <-t.C:
		// The work is drained and committed: a clean stop, only the group
		// learns of it late. librdkafka holds the leave back behind a
		// JoinGroup request in flight, which the coordinator may keep for
		// the whole rebalance timeout (a chaos run logged "LeaveGroupRequest
		// … held back by preceding blocking JoinGroupRequest").
		c.log.Warn("close kafka consumer: still leaving the group; stopping without it (the group drops this member at its session timeout)",
			zap.Duration("waited", wait))
		return err
	}
	c.stopDeadQueues() // any assigned while the client closed
	c.dead.wait()
	c.handOvers.Wait()
	return err
}

// kafkaCloseGrace is how long Close waits for the Kafka client to leave the
// group when the shutdown deadline leaves less.
const kafkaCloseGrace = 5 * time.Second

// stopDeadQueues halts the dead-letter queues of the assigned partitions.
func (c *Consumer) stopDeadQueues() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.parts {
		c.dead.stopQueue(p)
	}
}

// closeActors stops the actors and waits for them; when a handler did not
// return after its cancel (unended), it waits at most cancelWait: that
// actor ends with its handler, and its partition's lease lapses.
func (c *Consumer) closeActors(unended bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.acts.close()
	}()
	if !unended {
		<-done
		return
	}
	select {
	case <-done:
	case <-time.After(cancelWait):
		c.log.Warn("close: an actor's handler still runs; stopping without it (its partition's lease lapses)")
	}
}

// endAll is the stop's hand-over, bounded like a revoke's: no new attempt
// or retry starts on any partition; the running attempts are awaited up to
// kafka.consumer.revoke_drain_limit (or less, when ctx leaves less room
// for the rest of the stop), then
// cancelled and awaited once more. The messages not started stay
// unfinished (uncommitted): the next owner reads them. It returns
// ErrDrainTimeout only when attempts still run after their cancel (their
// partitions' leases lapse instead of being given back).
func (c *Consumer) endAll(ctx context.Context) error {
	c.mu.Lock()
	ps := make([]*partition, 0, len(c.parts))
	for _, p := range c.parts {
		ps = append(ps, p)
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.dropped.Store(true)
	}
	limit := c.cfg.Kafka.Consumer.RevokeDrainLimit
	if dl, ok := ctx.Deadline(); ok {
		// What follows — the cancelled attempts' wait, the commit, the
		// group's leave, and the daemon's own (the fleet) — must fit in
		// what ctx leaves.
		limit = max(min(limit, time.Until(dl)-cancelWait-kafkaCloseGrace), 0)
	}
	unended, st := c.endWork(ps, limit)
	c.log.Info("close: handler attempts ended", zap.Int("awaited", st.awaited), zap.Int("cancelled", st.cancelled),
		zap.Int("left_to_lapsing_lease", st.lapsed), zap.Int("not_started", c.InFlight()))
	if len(unended) > 0 {
		c.log.Warn("close: handler attempts still running after their cancel; their partitions' leases lapse", zap.Int("running", st.lapsed))
		return ErrDrainTimeout
	}
	return nil
}

// OutageDetail is the downstream gate's line for /readyz ("" while it is
// closed).
func (c *Consumer) OutageDetail() string { return c.gate.detail() }
