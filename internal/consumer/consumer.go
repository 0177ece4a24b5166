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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
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
	// ErrDrainTimeout is returned by Close when in-flight messages were not
	// finished before its context ended; their offsets stay uncommitted.
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

// WithGroup overrides kafka.consumer.group_id.
func WithGroup(g string) Option { return func(c *Consumer) { c.group = g } }

// partition is the consumer's state for one assigned partition.
type partition struct {
	topic   string
	id      int32
	tracker *offsets.Tracker
	// committed is the last committed offset and meta the finished offsets
	// behind it listed in that commit's metadata (guarded by
	// Consumer.commitMu).
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
	dlq     DeadLetters
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

	commitMu sync.Mutex // serialises commits with revoke and shutdown
	aborted  bool       // guarded by commitMu: no commit after a simulated crash

	sinceCommit atomic.Int64
	kick        chan struct{} // cap 1: a pending "commit now" is enough

	stopPoll   chan struct{}
	pollDone   chan struct{}
	stopCommit chan struct{}
	commitDone chan struct{}
	closing    atomic.Bool
	started    bool
	closeOnce  sync.Once
	closeErr   error

	// onFinish, when set, replaces the tracker's commits: it is called
	// with each finished message, from the actor, and the periodic and
	// final commits are off. A test seam (the per-message strategy that
	// loses messages on a crash, I2, lives in the test that shows it).
	onFinish func(c *Consumer, p *partition, offset int64)

	// sb is the standby state: out of the group on purpose (SetStandby).
	sb standby

	// gate holds messages while the downstream fails for many users (nil:
	// off).
	gate *gate

	// retries are the pending retries of dead letters that were not
	// durable yet; shutdown stops them.
	retryMu sync.Mutex
	retries map[Timer]struct{}
	// notDurable is the last failed dead-letter send (DeadLetterDetail).
	notDurable atomic.Pointer[notDurable]

	// deadWG counts the partitions' dead-letter goroutines (deadqueue.go).
	deadWG sync.WaitGroup

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
		handler: h, dlq: dlq, parts: map[tpKey]*partition{}, kick: make(chan struct{}, 1),
		stopPoll: make(chan struct{}), pollDone: make(chan struct{}),
		stopCommit: make(chan struct{}), commitDone: make(chan struct{}),
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
	c.prefetch, _ = c.limiter.(Prefetcher)
	c.runCtx, c.cancelRun = context.WithCancel(context.Background())
	c.retries = map[Timer]struct{}{}
	c.acts = newRegistry(cfg.Processor.MailboxSize, cfg.Processor.IdleTimeout, c.clock, c.process,
		func(d int) { c.m.active.Add(float64(d)) })
	c.acts.onIdle = c.forget
	c.installBatch()
	kc, err := kafka.NewConsumer(kafkaclient.Consumer(cfg.Kafka, c.group))
	if err != nil {
		c.cancelRun()
		return nil, fmt.Errorf("consumer: create kafka consumer: %w", err)
	}
	c.kc = kc
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
	go c.pollLoop()
	go c.commitLoop()
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

// polled is a record read by the poll goroutine, with the partition it
// belonged to when it was read (a revoke inside a later Poll of the same
// batch marks that partition dropped, and the record is skipped).
type polled struct {
	km   *kafka.Message
	part *partition
}

func (c *Consumer) pollLoop() {
	defer close(c.pollDone)
	lagEvery := c.cfg.Kafka.Consumer.CommitInterval
	nextLag := c.clock.Now().Add(lagEvery)
	c.batch = make([]polled, 0, maxPollBatch)
	for {
		select {
		case <-c.stopPoll:
			return
		default:
		}
		c.batch = c.poll(c.batch[:0])
		if len(c.batch) > 0 {
			c.dispatch(c.batch)
			clear(c.batch)
		}
		c.flowControl()
		c.applyStandby()
		if now := c.clock.Now(); !now.Before(nextLag) {
			c.updateLag()
			nextLag = now.Add(lagEvery)
		}
	}
}

// poll waits up to 100 ms for the first event, then takes whatever else is
// already queued locally without waiting, up to maxPollBatch records.
func (c *Consumer) poll(batch []polled) []polled {
	timeout := 100
	for range maxPollBatch {
		ev := c.kc.Poll(timeout)
		timeout = 0
		switch e := ev.(type) {
		case nil:
			return batch
		case *kafka.Message:
			if e.TopicPartition.Error != nil {
				c.log.Warn("record with partition error", zap.Error(e.TopicPartition.Error))
				continue
			}
			p := c.parts[tpKey{*e.TopicPartition.Topic, e.TopicPartition.Partition}]
			if p == nil || p.dropped.Load() {
				continue // not ours (any more); the owner reads it
			}
			batch = append(batch, polled{km: e, part: p})
			// Stop at the in-flight cap so that flowControl pauses the
			// partition before more of it is read, as without batching;
			// likewise at a full dead-letter queue.
			if p.batched++; p.tracker.InFlight()+p.batched >= c.cfg.Processor.MaxInFlight {
				return batch
			}
			if p.dead != nil && p.dead.waiting.Load() >= int64(c.cfg.Processor.DeadLetterQueue) {
				return batch
			}
		case kafka.Error:
			if e.IsFatal() {
				c.log.Error("kafka consumer fatal error", zap.Error(e))
			} else {
				c.log.Warn("kafka consumer error", zap.Error(e))
			}
		}
	}
	return batch
}

// dispatch tracks and routes a batch of records in offset order (poll
// goroutine only): first every record is tracked and given its user, then
// the limiter may prefetch the users' state in one round trip, then each
// record passes breaker → limiter → mailbox.
func (c *Consumer) dispatch(batch []polled) {
	envs, users := c.envs[:0], c.users[:0]
	for _, r := range batch {
		r.part.batched = 0
		if env := c.admit(r.km, r.part); env != nil {
			envs = append(envs, env)
			users = append(users, env.user)
		}
	}
	if c.prefetch != nil && len(users) > 0 {
		c.prefetch.Prefetch(c.runCtx, users, c.clock.Now())
	}
	for _, env := range envs {
		c.route(env)
	}
	clear(envs)
	c.envs, c.users = envs[:0], users[:0]
}

// admit tracks one record and finds its user: the record key, or for a
// record without key the decoded external_userid. It returns nil when the
// record needs no routing (skipped, or dead-lettered as invalid).
func (c *Consumer) admit(km *kafka.Message, p *partition) *envelope {
	if p.dropped.Load() {
		return nil
	}
	off := int64(km.TopicPartition.Offset)
	if !p.tracker.Add(off) {
		return nil // redelivered below what we already track (after a seek); ignore
	}
	c.m.consumed.Inc()
	env := &envelope{km: km, part: p}
	if c.finishedBefore(p, off) {
		c.m.priorFinished.Inc()
		c.finish(env)
		return nil
	}
	if max := c.cfg.Processor.MaxMessageBytes; len(km.Value) > max {
		env.user = string(km.Key)
		c.deadLetter(env, ReasonInvalidMessage, fmt.Sprintf("value of %d bytes exceeds processor.max_message_bytes %d", len(km.Value), max), false, 0)
		return nil
	}
	if len(km.Key) > 0 {
		env.user = string(km.Key)
		return env // decoded by the actor
	}
	msg, err := chatmsg.Decode(km.Value)
	if err != nil {
		c.deadLetter(env, ReasonInvalidMessage, err.Error(), false, 0)
		return nil
	}
	env.msg, env.user = msg, msg.ExternalUserID
	return env
}

// forget drops the limiter's and the breaker's in-memory state of a user
// whose actor ended idle. What they keep in Redis (blocks, groups) is read
// again when the user comes back; they keep a user whose state still
// matters (violations counted, a breaker not closed) themselves.
func (c *Consumer) forget(user string) {
	if f, ok := c.limiter.(Forgetter); ok {
		f.Forget(user)
	}
	if f, ok := c.breaker.(Forgetter); ok {
		f.Forget(user)
	}
}

// maxSendTimeSkew is how far WeChat's send_time may be ahead of the
// record's produce time (the two clocks differ) and still be trusted.
const maxSendTimeSkew = 30 * time.Second

// sentAt is when the customer sent the record's message, the time the rate
// limiter counts by: a backlog processed at catch-up speed (after a
// redeploy, an outage, a consumer crash) must be judged by how fast the
// customer sent, not how fast we read. It is the send_time header (WeChat's
// send_time); the record's produce timestamp when the header is missing or
// unreadable, or when it claims a time more than maxSendTimeSkew after the
// record was produced (a message cannot be sent after it was produced: that
// is a wrong clock); the consumer's clock when the record has neither.
func (c *Consumer) sentAt(km *kafka.Message) time.Time {
	produced := c.producedAt(km)
	for _, h := range km.Headers {
		if h.Key != chatmsg.HeaderSendTime {
			continue
		}
		sec, err := strconv.ParseInt(string(h.Value), 10, 64)
		if err != nil || sec <= 0 {
			break
		}
		if t := time.Unix(sec, 0); !t.After(produced.Add(maxSendTimeSkew)) {
			return t
		}
		break
	}
	return produced
}

// producedAt is the record's produce timestamp, or the consumer's clock
// when the record has none.
func (c *Consumer) producedAt(km *kafka.Message) time.Time {
	if km.TimestampType == kafka.TimestampNotAvailable || km.Timestamp.IsZero() {
		return c.clock.Now()
	}
	return km.Timestamp
}

// admittedBefore reports whether a message that failed for reason had
// passed the limiter: route runs breaker → limiter → mailbox → handler, so
// a full mailbox and the handler's failures come after the limiter's yes.
// Refusals of the breaker and the limiter, and anything else (an invalid
// record, a reason this consumer does not give), did not — or may not have.
func admittedBefore(reason string) bool {
	switch reason {
	case ReasonQueueFull, ReasonDownstreamError, ReasonProcessTimeout:
		return true
	}
	return false
}

// limitAt says whether the limiter judges the record, and by which time.
// A record re-injected from the DLQ (the retry_from_dlq header; the
// scheduler and an operator's retry both set it) is not new traffic:
//   - one whose failure came after the limiter admitted it
//     (admittedBefore) was judged once already: the limiter does not see
//     it again — no window slot, no violation, no block — so a user's
//     recovered letters never block the user;
//   - one the limiter (or the breaker, before it) refused is judged again
//     at its re-injection time (the record's produce time), not at its
//     send time: a send time older than the user's newest would count as
//     the newest, and every letter of a recovery would land in one
//     window. A user who is still blocked is refused again, so a bot's
//     flood an operator retries is still stopped.
//
// Any other record is judged at sentAt.
func (c *Consumer) limitAt(km *kafka.Message) (at time.Time, judge bool) {
	retried, failure := false, ""
	for _, h := range km.Headers {
		switch h.Key {
		case chatmsg.HeaderRetryFromDLQ:
			retried = string(h.Value) == "true"
		case chatmsg.HeaderOriginalFailure:
			failure = string(h.Value)
		}
	}
	if !retried {
		return c.sentAt(km), true
	}
	if admittedBefore(failure) {
		return time.Time{}, false
	}
	return c.producedAt(km), true
}

// route applies breaker → limiter → mailbox to one admitted record.
func (c *Consumer) route(env *envelope) {
	user := env.user
	if c.breaker != nil {
		done, err := c.breaker.Allow(user)
		if err != nil {
			c.deadLetter(env, ReasonCircuitOpen, err.Error(), true, 0)
			return
		}
		env.breakerDone = done
	}
	if at, judge := c.limitAt(env.km); judge && c.limiter != nil {
		if v := c.limiter.Allow(c.runCtx, user, at); !v.Allowed {
			reason := v.Reason
			if reason == "" {
				reason = ReasonRateLimited
			}
			c.deadLetter(env, reason, v.Details, true, 0)
			return
		}
	}
	if !c.acts.send(user, env) {
		if env.breakerDone != nil {
			env.breakerDone(false)
		}
		c.deadLetter(env, ReasonQueueFull, fmt.Sprintf("mailbox of %d messages is full", c.cfg.Processor.MailboxSize), true, 0)
	}
}

// flowControl pauses and resumes partitions (poll goroutine only). A
// partition is paused for two reasons, each with its own high and low
// mark, and stays paused until neither holds:
//   - its in-flight count reached processor.max_in_flight (cleared below
//     processor.resume_below). It is the node-overload valve: one user can
//     hold at most mailbox_size messages, so a single user cannot trigger
//     it (I5).
//   - its dead-letter queue holds processor.dead_letter_queue letters not
//     durable yet (cleared below half of that): the DLQ is slower than the
//     partition's refusals, and only this partition waits for it (I5).
//
// Pausing stops fetching the partition; messages already dispatched go on.
func (c *Consumer) flowControl() {
	pc := c.cfg.Processor
	for _, p := range c.parts {
		if p.dropped.Load() {
			continue
		}
		n := p.tracker.InFlight()
		switch {
		case !p.pausedCap && n >= pc.MaxInFlight:
			p.pausedCap = true
			c.m.paused.Inc()
			c.log.Info("partition paused: in-flight cap", zap.Int32("partition", p.id), zap.Int("in_flight", n))
		case p.pausedCap && n < pc.ResumeBelow:
			p.pausedCap = false
			c.m.paused.Dec()
			c.log.Info("partition in-flight cap cleared", zap.Int32("partition", p.id), zap.Int("in_flight", n))
		}
		if p.dead != nil {
			w := p.dead.waiting.Load()
			switch {
			case !p.pausedDead && w >= int64(pc.DeadLetterQueue):
				p.pausedDead = true
				c.m.deadPaused.Inc()
				c.m.deadPauses.Inc()
				c.log.Warn("partition paused: dead-letter queue full (the DLQ is slower than this partition's refusals)",
					zap.Int32("partition", p.id), zap.Int64("dead_letters_waiting", w))
			case p.pausedDead && w < int64(resumeDeadBelow(pc.DeadLetterQueue)):
				p.pausedDead = false
				c.m.deadPaused.Dec()
				c.log.Info("partition dead-letter queue drained", zap.Int32("partition", p.id),
					zap.Int64("dead_letters_waiting", w))
			}
		}
		c.setPaused(p, p.pausedCap || p.pausedDead)
	}
}

// resumeDeadBelow is the dead-letter queue's low mark: half of the high
// mark, so a queue hovering at the mark does not pause and resume the
// partition (each resume refetches it) for every letter.
func resumeDeadBelow(mark int) int { return max(mark/2, 1) }

// setPaused pauses or resumes p in the Kafka client when it is not as
// wanted; a failure is logged and tried again on the next call.
func (c *Consumer) setPaused(p *partition, want bool) {
	if p.paused == want {
		return
	}
	tp := []kafka.TopicPartition{{Topic: &p.topic, Partition: p.id}}
	if want {
		if err := c.kc.Pause(tp); err != nil {
			c.log.Warn("pause partition", zap.Int32("partition", p.id), zap.Error(err))
			return
		}
	} else if err := c.kc.Resume(tp); err != nil {
		c.log.Warn("resume partition", zap.Int32("partition", p.id), zap.Error(err))
		return
	}
	p.paused = want
	if !want {
		c.log.Info("partition resumed", zap.Int32("partition", p.id), zap.Int("in_flight", p.tracker.InFlight()))
	}
}

// resumeForRevoke resumes the partitions of ps that are paused and clears
// their pause reasons (poll goroutine, inside the rebalance callback).
func (c *Consumer) resumeForRevoke(kc *kafka.Consumer, ps []*partition) {
	for _, p := range ps {
		if p.pausedCap {
			p.pausedCap = false
			c.m.paused.Dec()
		}
		if p.pausedDead {
			p.pausedDead = false
			c.m.deadPaused.Dec()
		}
		if !p.paused {
			continue
		}
		if err := kc.Resume([]kafka.TopicPartition{{Topic: &p.topic, Partition: p.id}}); err != nil {
			c.log.Warn("resume revoked partition", zap.Int32("partition", p.id), zap.Error(err))
		}
		p.paused = false
	}
}

// baseUnknown marks a partition whose committed offset at assignment has
// not been read yet.
const baseUnknown = -2

// updateLag sets consumer lag from the cached high watermark (poll
// goroutine only): the high watermark minus the committable offset, or,
// before the partition finished a message, minus the oldest offset in
// flight or the offset committed when it was assigned — so a partition that
// is assigned but never progresses shows its lag and alerts. The committed
// offsets are read from the broker once per assignment.
func (c *Consumer) updateLag() {
	c.readBases()
	for _, p := range c.parts {
		next, ok := p.tracker.Committable()
		if !ok {
			next, ok = p.tracker.Oldest()
		}
		if !ok && p.base >= 0 {
			next, ok = p.base, true
		}
		low, high, err := c.kc.GetWatermarkOffsets(p.topic, p.id)
		if err != nil || high < 0 {
			continue
		}
		if !ok {
			if p.base != -1 || low < 0 {
				continue // not known yet
			}
			// Nothing committed: auto_offset_reset is earliest, so the
			// whole partition is behind.
			next = low
		}
		c.m.lag.WithLabelValues(p.label).Set(float64(max(high-next, 0)))
	}
}

// readBases reads, in one request, the committed offsets of the assigned
// partitions whose base is not known yet.
func (c *Consumer) readBases() {
	var tps []kafka.TopicPartition
	for _, p := range c.parts {
		if p.base == baseUnknown {
			tps = append(tps, kafka.TopicPartition{Topic: &p.topic, Partition: p.id})
		}
	}
	if len(tps) == 0 {
		return
	}
	got, err := c.kc.Committed(tps, 2000)
	if err != nil {
		c.log.Warn("read committed offsets for lag", zap.Error(err))
		return
	}
	for _, tp := range got {
		p := c.parts[tpKey{*tp.Topic, tp.Partition}]
		if p == nil || tp.Error != nil {
			continue
		}
		if p.base = int64(tp.Offset); p.base < 0 {
			p.base = -1 // none committed
		}
	}
}

// committedReadTimeout bounds the read of the committed offsets on an
// assignment (inside the rebalance callback).
const committedReadTimeout = 5 * time.Second

// committedState is what the group's last commit of a partition says.
type committedState struct {
	base     int64   // the committed offset; -1 none
	finished []int64 // finished behind it (the commit's metadata)
}

// readPrior reads, in one request, the committed offsets of newly assigned
// partitions with their metadata: the finished offsets the previous owner
// listed behind its committed one, which this consumer then does not run
// again. When the read fails the partitions start without the list (every
// record from the committed offset on is read again, as dedup expects).
func (c *Consumer) readPrior(kc *kafka.Consumer, tps []kafka.TopicPartition) map[tpKey]committedState {
	req := make([]kafka.TopicPartition, len(tps))
	for i, tp := range tps {
		req[i] = kafka.TopicPartition{Topic: tp.Topic, Partition: tp.Partition}
	}
	got, err := kc.Committed(req, int(committedReadTimeout.Milliseconds()))
	if err != nil {
		c.log.Warn("read committed offsets on assignment; the previous owner's finished offsets are read again", zap.Error(err))
		return nil
	}
	out := make(map[tpKey]committedState, len(got))
	for _, tp := range got {
		if tp.Error != nil || tp.Topic == nil {
			continue
		}
		st := committedState{base: int64(tp.Offset)}
		if st.base < 0 {
			st.base = -1
		} else if tp.Metadata != nil {
			if st.finished, err = offsets.DecodeFinished(st.base, *tp.Metadata); err != nil {
				c.log.Warn("offset commit metadata not understood; its finished offsets are read again",
					zap.Int32("partition", tp.Partition), zap.Error(err))
			} else if len(st.finished) > 0 {
				c.log.Info("the previous owner finished records behind its committed offset; they are not run again",
					zap.Int32("partition", tp.Partition), zap.Int64("committed", st.base), zap.Int("finished", len(st.finished)))
			}
		}
		out[tpKey{*tp.Topic, tp.Partition}] = st
	}
	return out
}

// finishedBefore reports whether the previous owner of p finished off
// (poll goroutine; offsets come in ascending order).
func (c *Consumer) finishedBefore(p *partition, off int64) bool {
	for p.priorAt < len(p.prior) && p.prior[p.priorAt] < off {
		p.priorAt++
	}
	return p.priorAt < len(p.prior) && p.prior[p.priorAt] == off
}

// rebalance handles cooperative assign and revoke (called inside Poll, on
// the poll goroutine, or inside kafka.Consumer.Close).
func (c *Consumer) rebalance(kc *kafka.Consumer, ev kafka.Event) error {
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		var prior map[tpKey]committedState
		if !c.closing.Load() {
			// Not while closing: nothing will be consumed from them, and
			// the group may not answer a member on its way out (the read
			// then held the close up for its whole timeout).
			prior = c.readPrior(kc, e.Partitions)
		}
		c.mu.Lock()
		for _, tp := range e.Partitions {
			k := tpKey{*tp.Topic, tp.Partition}
			p := &partition{topic: k.topic, id: k.id, tracker: offsets.NewTracker(k.id), committed: -1,
				base: baseUnknown, label: strconv.Itoa(int(k.id))}
			if pr, ok := prior[k]; ok {
				p.base, p.prior = pr.base, pr.finished
			}
			c.startDeadQueue(p)
			c.startLease(p)
			c.parts[k] = p
		}
		c.m.assigned.Set(float64(len(c.parts)))
		c.mu.Unlock()
		c.m.rebalances.WithLabelValues("assign").Inc()
		c.log.Info("partitions assigned", zap.Any("partitions", e.Partitions))
		if err := kc.IncrementalAssign(e.Partitions); err != nil {
			c.log.Error("incremental assign", zap.Error(err))
			return err
		}
	case kafka.RevokedPartitions:
		var ps []*partition
		for _, tp := range e.Partitions {
			if p := c.parts[tpKey{*tp.Topic, tp.Partition}]; p != nil {
				ps = append(ps, p)
			}
		}
		if kc.AssignmentLost() {
			// Someone else may own them already: committing now could move
			// their offsets backwards. Drop without committing.
			c.m.rebalances.WithLabelValues("lost").Inc()
			c.log.Warn("partitions lost", zap.Any("partitions", e.Partitions))
		} else {
			c.m.rebalances.WithLabelValues("revoke").Inc()
			c.log.Info("partitions revoked", zap.Any("partitions", e.Partitions))
			// On standby (Redis lost) nothing in flight can finish: hand
			// the partitions over at once.
			if !c.closing.Load() && !c.sb.on {
				c.drain(ps, c.cfg.Kafka.Consumer.RevokeDrainLimit)
			}
			if err := c.commit(ps); err != nil {
				c.log.Warn("commit on revoke", zap.Error(err))
			}
		}
		// After the last commit: the next owner, waiting for the leases,
		// starts where this one ended.
		c.releaseLeases(ps)
		// A paused partition must be resumed before it goes: librdkafka
		// keeps the application's pause across an unassign and a later
		// assign of the same partition, which would then never be fetched
		// again on this member.
		c.resumeForRevoke(kc, ps)
		c.mu.Lock()
		for _, p := range ps {
			// Its letters not durable yet stay uncommitted: the next owner
			// reads their records again.
			c.stopDeadQueue(p)
			p.dropped.Store(true)
			delete(c.parts, tpKey{p.topic, p.id})
			c.m.lag.DeleteLabelValues(p.label)
		}
		c.m.assigned.Set(float64(len(c.parts)))
		c.mu.Unlock()
		if err := kc.IncrementalUnassign(e.Partitions); err != nil {
			c.log.Error("incremental unassign", zap.Error(err))
			return err
		}
	}
	return nil
}

// drain waits until ps have no in-flight messages or limit passes.
func (c *Consumer) drain(ps []*partition, limit time.Duration) bool {
	deadline := c.clock.Now().Add(limit)
	for {
		n := 0
		for _, p := range ps {
			n += p.tracker.InFlight()
		}
		if n == 0 {
			return true
		}
		if !c.clock.Now().Before(deadline) {
			c.log.Warn("drain limit reached; unfinished messages will be read again by the next owner", zap.Int("in_flight", n))
			return false
		}
		sleep(context.Background(), c.clock, 5*time.Millisecond)
	}
}

func (c *Consumer) commitLoop() {
	defer close(c.commitDone)
	interval := c.cfg.Kafka.Consumer.CommitInterval
	tick := make(chan struct{}, 1)
	t := c.clock.AfterFunc(interval, func() {
		select {
		case tick <- struct{}{}:
		default:
		}
	})
	defer t.Stop()
	for {
		select {
		case <-c.stopCommit:
			return
		case <-tick:
			t.Reset(interval)
		case <-c.kick:
		}
		c.sinceCommit.Store(0)
		if err := c.commit(nil); err != nil {
			c.log.Warn("periodic commit", zap.Error(err))
		}
	}
}

// commit commits the committable offsets of ps (all partitions when ps is
// nil) that moved since their last commit. It is synchronous; the periodic
// caller is the commit goroutine, so the poll loop never waits for it.
func (c *Consumer) commit(ps []*partition) error {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	if c.aborted || c.onFinish != nil {
		return nil
	}
	if ps == nil {
		c.mu.Lock()
		for _, p := range c.parts {
			ps = append(ps, p)
		}
		c.mu.Unlock()
	}
	var list []kafka.TopicPartition
	var moved []*partition
	var nexts []int64
	var metas []string
	for _, p := range ps {
		next, ok := p.tracker.Committable()
		above := p.tracker.FinishedAbove()
		if len(p.prior) > 0 {
			// The previous owner's list holds until this owner has read
			// past it: a crash before then must not lose it.
			above = mergeAbove(above, p.prior)
		}
		if !ok && len(above) > 0 {
			// Nothing committable yet, but finished work behind the first
			// message: commit where the partition starts, with the list.
			next, ok = p.tracker.Oldest()
		}
		if !ok {
			continue
		}
		for len(above) > 0 && above[0] <= next {
			above = above[1:]
		}
		meta, truncated := offsets.EncodeFinished(next, above, offsets.MaxMetadata)
		if next < p.committed || next == p.committed && meta == p.meta {
			continue
		}
		if truncated {
			c.m.metaTruncated.Inc()
		}
		md := meta
		list = append(list, kafka.TopicPartition{Topic: &p.topic, Partition: p.id, Offset: kafka.Offset(next), Metadata: &md})
		moved = append(moved, p)
		nexts = append(nexts, next)
		metas = append(metas, meta)
	}
	if len(list) == 0 {
		return nil
	}
	res, err := c.kc.CommitOffsets(list)
	if err == nil {
		for _, tp := range res {
			if tp.Error != nil {
				err = fmt.Errorf("partition %d: %w", tp.Partition, tp.Error)
				break
			}
		}
	}
	if err != nil {
		c.m.commits.WithLabelValues("error").Inc()
		return fmt.Errorf("commit offsets: %w", err)
	}
	c.m.commits.WithLabelValues("ok").Inc()
	for i, p := range moved {
		p.committed, p.meta = nexts[i], metas[i]
	}
	return nil
}

// mergeAbove returns the ascending union of a and b without repeats.
func mergeAbove(a, b []int64) []int64 {
	out := make([]int64, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		var v int64
		switch {
		case len(b) == 0 || len(a) > 0 && a[0] < b[0]:
			v, a = a[0], a[1:]
		case len(a) == 0 || b[0] < a[0]:
			v, b = b[0], b[1:]
		default:
			v, a, b = a[0], a[1:], b[1:]
		}
		out = append(out, v)
	}
	return out
}

// groupMovedOn reports whether err is the group coordinator refusing a
// commit because the group has moved to a new generation without this
// member (a rebalance in progress, or it was expelled): the partitions
// are no longer this member's to commit.
func groupMovedOn(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke.Code() {
	case kafka.ErrIllegalGeneration, kafka.ErrRebalanceInProgress, kafka.ErrUnknownMemberID, kafka.ErrFencedInstanceID:
		return true
	}
	return false
}

// finish marks env's offset finished (handled, duplicate, or durably
// dead-lettered).
func (c *Consumer) finish(env *envelope) {
	p, off := env.part, int64(env.km.TopicPartition.Offset)
	if c.onFinish != nil {
		c.onFinish(c, p, off)
	}
	p.tracker.Done(off)
	if n := c.sinceCommit.Add(1); n >= int64(c.cfg.Kafka.Consumer.CommitEveryN) {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// Close stops consuming, waits (until ctx ends) for in-flight messages to
// finish, commits the finished prefix synchronously and closes the Kafka
// consumer (leaving the group). When ctx ends first, handlers are
// cancelled, unfinished messages stay uncommitted (they are read again)
// and Close returns ErrDrainTimeout.
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
		c.commitMu.Lock()
		c.aborted = true
		c.commitMu.Unlock()
		c.cancelRun()
	}
	var err error
	if c.started {
		close(c.stopPoll)
		<-c.pollDone
		if !crash && !c.waitIdle(ctx) {
			err = ErrDrainTimeout
		}
	}
	c.cancelRun()
	c.stopRetries()
	c.stopDeadQueues()
	c.acts.close()
	if c.started {
		close(c.stopCommit)
		<-c.commitDone
		if !crash {
			if cerr := c.commit(nil); groupMovedOn(cerr) {
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
	c.deadWG.Wait()
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
		c.stopDeadQueue(p)
	}
}

// waitIdle waits until no message is in flight or ctx ends.
func (c *Consumer) waitIdle(ctx context.Context) bool {
	for c.InFlight() > 0 {
		if !sleep(ctx, c.clock, 5*time.Millisecond) {
			c.log.Warn("close: in-flight messages left unfinished", zap.Int("in_flight", c.InFlight()))
			return false
		}
	}
	return true
}

// OutageDetail is the downstream gate's line for /readyz ("" while it is
// closed).
func (c *Consumer) OutageDetail() string { return c.gate.detail() }
