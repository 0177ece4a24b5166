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
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
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
type Option func(*options)

// options are what the Options set; New wires them into the parts.
type options struct {
	log      *zap.Logger
	reg      prometheus.Registerer
	clock    Clock
	state    State
	limiter  Limiter
	breaker  Breaker
	limitMem LimitMemory
	group    string
	batch    batchMode
}

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithRegisterer registers the consumer's metrics (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.reg = r } }

// WithClock sets the time source (default: the system clock).
func WithClock(clk Clock) Option { return func(o *options) { o.clock = clk } }

// WithState sets the consumer-state store (I3): partition leases and done
// marks. Without one every message is handled, so redeliveries after a
// crash repeat effects.
func WithState(s State) Option { return func(o *options) { o.state = s } }

// WithLimiter sets the per-user rate limiter (default: none).
func WithLimiter(l Limiter) Option { return func(o *options) { o.limiter = l } }

// WithBreaker sets the per-user circuit breaker (default: none).
func WithBreaker(b Breaker) Option { return func(o *options) { o.breaker = b } }

// WithLimitMemory sets where the handler limit is kept across the group's
// members and restarts (default: nowhere; every start begins at
// overload.initial_limit).
func WithLimitMemory(m LimitMemory) Option { return func(o *options) { o.limitMem = m } }

// WithGroup overrides kafka.consumer.group_id.
func WithGroup(g string) Option { return func(o *options) { o.group = g } }

// Consumer reads the main topic in a consumer group and drives the
// per-user actors. Start begins consuming; Close stops gracefully.
//
// It only assembles its parts — the poller, the ownership, the processor,
// the mailboxes, the committer, the dead-lettering — and runs their
// lifecycle; docs/architecture.md ("The consumer's parts") lists what each
// owns, and partition.go what they hand each other.
type Consumer struct {
	*core
	group     string
	cancelRun context.CancelFunc

	kc       *kafka.Consumer
	poll     *poller
	own      *ownership
	proc     *processor
	acts     *registry
	commits  *committer
	dead     *deadLetterer
	limitMem LimitMemory

	started   bool
	closeOnce sync.Once
	closeErr  error
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
	o := options{group: cfg.Kafka.Consumer.GroupID}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	if o.clock == nil {
		o.clock = realClock{}
	}
	topic := cfg.Kafka.Topics.Main.Name
	if err := validate(topic, o.group); err != nil {
		return nil, err
	}
	k := &core{cfg: cfg, topic: topic, log: o.log, clock: o.clock, m: newMetrics(o.reg)}
	var cancelRun context.CancelFunc
	k.runCtx, cancelRun = context.WithCancel(context.Background())
	kc, err := kafka.NewConsumer(kafkaclient.Consumer(cfg.Kafka, o.group))
	if err != nil {
		cancelRun()
		return nil, fmt.Errorf("consumer: create kafka consumer: %w", err)
	}
	c := &Consumer{core: k, group: o.group, cancelRun: cancelRun, kc: kc, limitMem: o.limitMem,
		commits: &committer{}}
	c.own = &ownership{core: k, state: o.state, parts: map[tpKey]*partition{}}
	c.dead = newDeadLetterer(dlq, k.runCtx, c.commits.finish, cfg.Processor, k.clock, k.log, k.m)
	c.proc = &processor{core: k, handler: h, own: c.own, dead: c.dead, commits: c.commits, batch: o.batch,
		gate: newGate(cfg.Outage, k.clock, k.log, o.reg), down: newDownstream(cfg, k.clock.Now, o.reg)}
	c.acts = newRegistry(cfg.Processor.MailboxSize, cfg.Processor.IdleTimeout, k.clock, c.proc.process,
		func(d int) { k.m.active.Add(float64(d)) })
	c.poll = newPoller(k, kc, c.own, c.acts, o.limiter, o.breaker, c.dead, c.commits)
	c.acts.onIdle = c.poll.forget
	if o.batch.max > 1 {
		o.batch.handle = c.proc.processBatch
		c.acts.batch = o.batch
	}
	c.commits.init(cfg.Kafka.Consumer, kc, c.own.snapshot, k.clock, k.log, k.m)
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
	if err := c.kc.SubscribeTopics([]string{c.topic}, c.poll.rb.rebalance); err != nil {
		return fmt.Errorf("consumer: subscribe %s: %w", c.topic, err)
	}
	c.started = true
	c.proc.down.recall(c.runCtx, c.limitMem, c.group, c.log)
	go c.poll.run()
	c.commits.start()
	return nil
}

// Partitions returns the main-topic partitions the consumer holds now,
// ascending.
func (c *Consumer) Partitions() []int32 {
	ps := c.own.snapshot()
	out := make([]int32, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.id)
	}
	slices.Sort(out)
	return out
}

// ActiveProcessors returns the number of live per-user actors.
func (c *Consumer) ActiveProcessors() int { return c.acts.len() }

// InFlight returns the number of messages read but not yet finished.
func (c *Consumer) InFlight() int {
	n := 0
	for _, p := range c.own.snapshot() {
		n += p.tracker.InFlight()
	}
	return n
}

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
	c.poll.rb.closing.Store(true)
	if crash {
		c.commits.abort()
		c.cancelRun()
	}
	var err error
	if c.started {
		c.poll.stop()
		if !crash {
			err = c.endAll(ctx)
		}
	}
	c.cancelRun()
	c.proc.down.stopRemembering()
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
	c.own.handOvers.Wait()
	return err
}

// kafkaCloseGrace is how long Close waits for the Kafka client to leave the
// group when the shutdown deadline leaves less.
const kafkaCloseGrace = 5 * time.Second

// stopDeadQueues halts the dead-letter queues of the assigned partitions.
func (c *Consumer) stopDeadQueues() {
	for _, p := range c.own.snapshot() {
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
	ps := c.own.snapshot()
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
	unended, st := c.own.endWork(ps, limit)
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
func (c *Consumer) OutageDetail() string { return c.proc.gate.detail() }

// SetStandby takes the consumer out of its group (on) or back in (off).
//
// A consumer that cannot protect effects — its Redis is unreachable while
// the other members still have theirs — should not keep partitions it
// cannot process: its users would wait for its Redis to return although
// another member could serve them. On standby it unsubscribes; the revoke
// drains what can finish (processor drain limit), commits the finished
// prefix, and the partitions go to the other members, whose dedup claims
// wait for any claim this one still holds (I3). When every member loses
// Redis they all stand by, which costs nothing more than the outage: no
// member could process anyway. Off subscribes again (a rebalance gives it
// partitions back). The change is applied by the poll goroutine within a
// poll (≤ 100 ms).
func (c *Consumer) SetStandby(on bool, reason string) { c.poll.sb.set(on, reason) }

// StandbyDetail is the /readyz line while on standby ("" otherwise).
func (c *Consumer) StandbyDetail() string { return c.poll.sb.detail(c.clock.Now()) }

// DeadLetterDetail is the /readyz detail while dead letters cannot be
// recorded: how many wait, how many partitions are paused for them, and
// the last error (the DLQ topic's and the emergency file's). Empty when
// every send of the last 30 s was recorded, or nothing waits.
func (c *Consumer) DeadLetterDetail() string {
	nd := c.dead.notDurable.Load()
	if nd == nil || c.clock.Now().Sub(nd.at) > 30*time.Second {
		return ""
	}
	waiting := int64(0)
	for _, p := range c.own.snapshot() {
		if p.dead != nil {
			waiting += p.dead.waiting.Load()
		}
	}
	if waiting == 0 {
		return ""
	}
	return fmt.Sprintf("%d dead letters not recorded, retried; their partitions pause at processor.dead_letter_queue and nothing after them is committed: %v",
		waiting, nd.err)
}
