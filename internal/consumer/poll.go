package consumer

// The poll goroutine: it polls records, judges each (size, decode, limiter,
// breaker) and routes it to its user's actor.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// maxPollBatch bounds how many already-fetched records the poll goroutine
// takes before dispatching them; it bounds the dispatch delay of the first
// record of a batch and the size of one limiter prefetch.
const maxPollBatch = 256

// maxSendTimeSkew is how far WeChat's send_time may be ahead of the
// record's produce time (the two clocks differ) and still be trusted.
const maxSendTimeSkew = 30 * time.Second

// poller is the goroutine that owns the Kafka client: it polls records,
// judges each (size, decode, breaker → limiter → mailbox) and routes it to
// its user's actor, pauses and resumes partitions (flow.go), reports lag,
// serves the rebalances (rebalance.go) and the standby (standby.go).
type poller struct {
	*core
	kc       *kafka.Consumer
	own      *ownership
	acts     *registry
	limiter  Limiter
	prefetch Prefetcher // limiter when it implements Prefetcher, else nil
	breaker  Breaker
	dead     *deadLetterer
	commits  *committer
	flow     *flow
	rb       *rebalancer
	sb       standby
	// scratch is reused for every batch (poll goroutine).
	scratch struct {
		batch []polled
		envs  []*envelope
		users []string
	}
	stopPoll chan struct{}
	pollDone chan struct{}
}

func newPoller(k *core, kc *kafka.Consumer, own *ownership, acts *registry, l Limiter, b Breaker,
	dead *deadLetterer, commits *committer) *poller {
	po := &poller{core: k, kc: kc, own: own, acts: acts, limiter: l, breaker: b, dead: dead, commits: commits,
		stopPoll: make(chan struct{}), pollDone: make(chan struct{})}
	po.prefetch, _ = l.(Prefetcher)
	po.flow = &flow{core: k, kc: kc, own: own}
	po.rb = &rebalancer{core: k, own: own, dead: dead, commits: commits, flow: po.flow, sb: &po.sb}
	return po
}

// stop ends the poll goroutine and waits for it.
func (po *poller) stop() {
	close(po.stopPoll)
	<-po.pollDone
}

func (po *poller) run() {
	defer close(po.pollDone)
	lagEvery := po.cfg.Kafka.Consumer.CommitInterval
	nextLag := po.clock.Now().Add(lagEvery)
	po.scratch.batch = make([]polled, 0, maxPollBatch)
	for {
		select {
		case <-po.stopPoll:
			return
		default:
		}
		po.scratch.batch = po.poll(po.scratch.batch[:0])
		if len(po.scratch.batch) > 0 {
			po.dispatch(po.scratch.batch)
			clear(po.scratch.batch)
		}
		po.flow.flowControl()
		if !po.rb.closing.Load() {
			po.sb.apply(po.core, po.kc, po.rb.rebalance)
		}
		if now := po.clock.Now(); !now.Before(nextLag) {
			po.flow.updateLag()
			nextLag = now.Add(lagEvery)
		}
	}
}

// poll waits up to 100 ms for the first event, then takes whatever else is
// already queued locally without waiting, up to maxPollBatch records.
func (po *poller) poll(batch []polled) []polled {
	timeout := 100
	for range maxPollBatch {
		ev := po.kc.Poll(timeout)
		timeout = 0
		switch e := ev.(type) {
		case nil:
			return batch
		case *kafka.Message:
			if e.TopicPartition.Error != nil {
				po.log.Warn("record with partition error", zap.Error(e.TopicPartition.Error))
				continue
			}
			p := po.own.parts[tpKey{*e.TopicPartition.Topic, e.TopicPartition.Partition}]
			if p == nil || p.dropped.Load() {
				continue // not ours (any more); the owner reads it
			}
			batch = append(batch, polled{km: e, part: p})
			// Stop at the in-flight cap so that flowControl pauses the
			// partition before more of it is read, as without batching;
			// likewise at a full dead-letter queue.
			if p.batched++; p.tracker.InFlight()+p.batched >= po.cfg.Processor.MaxInFlight {
				return batch
			}
			if p.dead != nil && p.dead.waiting.Load() >= int64(po.cfg.Processor.DeadLetterQueue) {
				return batch
			}
		case kafka.Error:
			if e.IsFatal() {
				po.log.Error("kafka consumer fatal error", zap.Error(e))
			} else {
				po.log.Warn("kafka consumer error", zap.Error(e))
			}
		}
	}
	return batch
}

// dispatch tracks and routes a batch of records in offset order (poll
// goroutine only): first every record is tracked and given its user, then
// the limiter may prefetch the users' state in one round trip, then each
// record passes breaker → limiter → mailbox.
func (po *poller) dispatch(batch []polled) {
	envs, users := po.scratch.envs[:0], po.scratch.users[:0]
	for _, r := range batch {
		r.part.batched = 0
		if env := po.admit(r.km, r.part); env != nil {
			envs = append(envs, env)
			users = append(users, env.user)
		}
	}
	if po.prefetch != nil && len(users) > 0 {
		po.prefetch.Prefetch(po.runCtx, users, po.clock.Now())
	}
	for _, env := range envs {
		po.route(env)
	}
	clear(envs)
	po.scratch.envs, po.scratch.users = envs[:0], users[:0]
}

// admit tracks one record and finds its user: the record key, or for a
// record without key the decoded external_userid. It returns nil when the
// record needs no routing (skipped, or dead-lettered as invalid).
func (po *poller) admit(km *kafka.Message, p *partition) *envelope {
	if p.dropped.Load() {
		return nil
	}
	off := int64(km.TopicPartition.Offset)
	if !p.tracker.Add(off) {
		return nil // redelivered below what we already track (after a seek); ignore
	}
	po.m.consumed.Inc()
	env := &envelope{km: km, part: p}
	if p.prior.has(off) {
		po.m.priorFinished.Inc()
		po.commits.finish(env)
		return nil
	}
	if max := po.cfg.Processor.MaxMessageBytes; len(km.Value) > max {
		env.user = string(km.Key)
		po.dead.deadLetter(env, ReasonInvalidMessage, fmt.Sprintf("value of %d bytes exceeds processor.max_message_bytes %d", len(km.Value), max), 0)
		return nil
	}
	if len(km.Key) > 0 {
		env.user = string(km.Key)
		return env // decoded by the actor
	}
	msg, err := chatmsg.Decode(km.Value)
	if err != nil {
		po.dead.deadLetter(env, ReasonInvalidMessage, err.Error(), 0)
		return nil
	}
	env.msg, env.user = msg, msg.ExternalUserID
	return env
}

// forget drops the limiter's and the breaker's in-memory state of a user
// whose actor ended idle. What they keep in Redis (blocks, groups) is read
// again when the user comes back; they keep a user whose state still
// matters (violations counted, a breaker not closed) themselves.
func (po *poller) forget(user string) {
	if f, ok := po.limiter.(Forgetter); ok {
		f.Forget(user)
	}
	if f, ok := po.breaker.(Forgetter); ok {
		f.Forget(user)
	}
}

// sentAt is when the customer sent the record's message, the time the rate
// limiter counts by: a backlog processed at catch-up speed (after a
// redeploy, an outage, a consumer crash) must be judged by how fast the
// customer sent, not how fast we read. It is the send_time header (WeChat's
// send_time); the record's produce timestamp when the header is missing or
// unreadable, or when it claims a time more than maxSendTimeSkew after the
// record was produced (a message cannot be sent after it was produced: that
// is a wrong clock); the consumer's clock when the record has neither.
func (po *poller) sentAt(km *kafka.Message) time.Time {
	produced := po.producedAt(km)
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
func (po *poller) producedAt(km *kafka.Message) time.Time {
	if km.TimestampType == kafka.TimestampNotAvailable || km.Timestamp.IsZero() {
		return po.clock.Now()
	}
	return km.Timestamp
}

// limitAt says whether the limiter judges the record, and by which time.
// A record re-injected from the DLQ (the retry_from_dlq header; the
// scheduler and an operator's retry both set it) is not new traffic:
//   - one whose failure came after the limiter admitted it (the reason
//     table's PastLimiter) was judged once already: the limiter does not see
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
func (po *poller) limitAt(km *kafka.Message) (at time.Time, judge bool) {
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
		return po.sentAt(km), true
	}
	if deadletter.PastLimiter(deadletter.Reason(failure)) {
		return time.Time{}, false
	}
	return po.producedAt(km), true
}

// route applies breaker → limiter → mailbox to one admitted record.
func (po *poller) route(env *envelope) {
	user := env.user
	if po.breaker != nil {
		done, err := po.breaker.Allow(user)
		if err != nil {
			po.dead.deadLetter(env, ReasonCircuitOpen, err.Error(), 0)
			return
		}
		env.breakerDone = done
	}
	if at, judge := po.limitAt(env.km); judge && po.limiter != nil {
		if v := po.limiter.Allow(po.runCtx, user, at); !v.Allowed {
			reason := v.Reason
			if reason == "" {
				reason = ReasonRateLimited
			}
			po.dead.deadLetter(env, reason, v.Details, 0)
			return
		}
	}
	if !po.acts.send(user, env) {
		if env.breakerDone != nil {
			env.breakerDone(false)
		}
		po.dead.deadLetter(env, ReasonQueueFull, fmt.Sprintf("mailbox of %d messages is full", po.cfg.Processor.MailboxSize), 0)
	}
}
