package consumer

// Rebalances: reading what the group committed on assignment, draining
// and committing on revoke.

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/offsets"
)

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
func (rb *rebalancer) readPrior(kc *kafka.Consumer, tps []kafka.TopicPartition) map[tpKey]committedState {
	req := make([]kafka.TopicPartition, len(tps))
	for i, tp := range tps {
		req[i] = kafka.TopicPartition{Topic: tp.Topic, Partition: tp.Partition}
	}
	got, err := kc.Committed(req, int(committedReadTimeout.Milliseconds()))
	if err != nil {
		rb.log.Warn("read committed offsets on assignment; the previous owner's finished offsets are read again", zap.Error(err))
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
				rb.log.Warn("offset commit metadata not understood; its finished offsets are read again",
					zap.Int32("partition", tp.Partition), zap.Error(err))
			} else if len(st.finished) > 0 {
				rb.log.Info("the previous owner finished records behind its committed offset; they are not run again",
					zap.Int32("partition", tp.Partition), zap.Int64("committed", st.base), zap.Int("finished", len(st.finished)))
			}
		}
		out[tpKey{*tp.Topic, tp.Partition}] = st
	}
	return out
}

// rebalancer serves the group's cooperative rebalances: an assignment
// starts each partition's dead-letter queue and lease keeper; a revoke
// commits what is finished and hands the partitions over (own.go).
type rebalancer struct {
	*core
	own     *ownership
	dead    *deadLetterer
	commits *committer
	flow    *flow
	sb      *standby
	// closing is set when Close begins: nothing more is consumed.
	closing atomic.Bool
}

// rebalance handles cooperative assign and revoke (called inside Poll, on
// the poll goroutine, or inside kafka.Consumer.Close).
func (rb *rebalancer) rebalance(kc *kafka.Consumer, ev kafka.Event) error {
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		var prior map[tpKey]committedState
		if !rb.closing.Load() {
			// Not while closing: nothing will be consumed from them, and
			// the group may not answer a member on its way out (the read
			// then held the close up for its whole timeout).
			prior = rb.readPrior(kc, e.Partitions)
		}
		rb.own.mu.Lock()
		for _, tp := range e.Partitions {
			k := tpKey{*tp.Topic, tp.Partition}
			p := &partition{topic: k.topic, id: k.id, tracker: offsets.NewTracker(k.id), committed: -1,
				base: baseUnknown, label: strconv.Itoa(int(k.id))}
			if pr, ok := prior[k]; ok {
				p.base, p.prior.offs = pr.base, pr.finished
			}
			rb.dead.startQueue(p)
			p.after = rb.own.handingOver[k] // this consumer's own hand-over of it, if one runs
			rb.own.startLease(p)
			rb.own.parts[k] = p
		}
		rb.m.part.assigned.Set(float64(len(rb.own.parts)))
		rb.own.mu.Unlock()
		rb.m.part.rebalances.WithLabelValues("assign").Inc()
		rb.log.Info("partitions assigned", zap.Any("partitions", e.Partitions))
		if err := kc.IncrementalAssign(e.Partitions); err != nil {
			rb.log.Error("incremental assign", zap.Error(err))
			return err
		}
	case kafka.RevokedPartitions:
		var ps []*partition
		for _, tp := range e.Partitions {
			if p := rb.own.parts[tpKey{*tp.Topic, tp.Partition}]; p != nil {
				ps = append(ps, p)
			}
		}
		// The hand-over starts: no new attempt or retry of these
		// partitions starts from here on (own.go); their queued messages
		// are left to the next owner.
		for _, p := range ps {
			p.dropped.Store(true)
			p.work.close()
		}
		limit := rb.cfg.Kafka.Consumer.RevokeDrainLimit
		if kc.AssignmentLost() {
			// Someone else may be assigned them already: committing now
			// could move their offsets backwards, so nothing is committed.
			// What runs is awaited as on a revoke, not stopped at once:
			// ownership is the partition's lease, which this consumer
			// still holds (the next owner waits for it) and which ends
			// every attempt at its deadline. Stopping at once cancelled
			// calls a receiver had just answered, and the next owner
			// called it again (the 30-minute nemesis: a reply being sent
			// 20 ms after the receiver's answer, cancelled, the message
			// run again by the next owner).
			rb.m.part.rebalances.WithLabelValues("lost").Inc()
			rb.log.Warn("partitions lost", zap.Any("partitions", e.Partitions))
			if rb.sb.on {
				limit = 0
			}
		} else {
			rb.m.part.rebalances.WithLabelValues("revoke").Inc()
			rb.log.Info("partitions revoked", zap.Any("partitions", e.Partitions))
			// On standby (Redis lost) nothing in flight can finish: hand
			// the partitions over at once.
			if rb.sb.on {
				limit = 0
			}
			// What is finished now; what the running attempts finish
			// during the hand-over the next owner reads again and finds
			// done (their marks are sent before the lease is given back).
			if err := rb.commits.commit(ps); err != nil {
				rb.log.Warn("commit on revoke", zap.Error(err))
			}
		}
		if rb.closing.Load() {
			// Close already ended the work (shutdown): only the leases.
			rb.own.handOver(ps, 0)
		} else {
			// The running attempts are awaited (then cancelled) off the
			// poll goroutine: the partitions this consumer keeps go on
			// being served meanwhile. The next owner waits for the lease,
			// which is given back only when the work under it ended (or
			// lapses); this consumer, if the partition comes back to it,
			// waits for the hand-over too (handingOver).
			rb.own.handOverAsync(ps, limit)
		}
		// A paused partition must be resumed before it goes: librdkafka
		// keeps the application's pause across an unassign and a later
		// assign of the same partition, which would then never be fetched
		// again on this member.
		rb.flow.resumeForRevoke(kc, ps)
		rb.own.mu.Lock()
		for _, p := range ps {
			// Its letters not durable yet stay uncommitted: the next owner
			// reads their records again.
			rb.dead.stopQueue(p)
			delete(rb.own.parts, tpKey{p.topic, p.id})
			rb.m.part.lag.DeleteLabelValues(p.label)
		}
		rb.m.part.assigned.Set(float64(len(rb.own.parts)))
		rb.own.mu.Unlock()
		if err := kc.IncrementalUnassign(e.Partitions); err != nil {
			rb.log.Error("incremental unassign", zap.Error(err))
			return err
		}
	}
	return nil
}
