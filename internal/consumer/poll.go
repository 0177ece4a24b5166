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
)

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
		c.commits.finish(env)
		return nil
	}
	if max := c.cfg.Processor.MaxMessageBytes; len(km.Value) > max {
		env.user = string(km.Key)
		c.dead.deadLetter(env, ReasonInvalidMessage, fmt.Sprintf("value of %d bytes exceeds processor.max_message_bytes %d", len(km.Value), max), 0)
		return nil
	}
	if len(km.Key) > 0 {
		env.user = string(km.Key)
		return env // decoded by the actor
	}
	msg, err := chatmsg.Decode(km.Value)
	if err != nil {
		c.dead.deadLetter(env, ReasonInvalidMessage, err.Error(), 0)
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
			c.dead.deadLetter(env, ReasonCircuitOpen, err.Error(), 0)
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
			c.dead.deadLetter(env, reason, v.Details, 0)
			return
		}
	}
	if !c.acts.send(user, env) {
		if env.breakerDone != nil {
			env.breakerDone(false)
		}
		c.dead.deadLetter(env, ReasonQueueFull, fmt.Sprintf("mailbox of %d messages is full", c.cfg.Processor.MailboxSize), 0)
	}
}
