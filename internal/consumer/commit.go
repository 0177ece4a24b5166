package consumer

// Commits: the contiguous finished prefix of each partition, with the
// finished offsets behind it in the commit's metadata.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/offsets"
)

// committer commits each partition's contiguous finished prefix (I2), with
// the finished offsets behind it in the commit's metadata: from its own
// goroutine every kafka.consumer.commit_interval and after every
// kafka.consumer.commit_every_n finished messages (finish), and
// synchronously on revoke and on shutdown (commit). The zero value counts
// finished messages and commits nothing (unit tests' consumers).
type committer struct {
	kc interface {
		CommitOffsets([]kafka.TopicPartition) ([]kafka.TopicPartition, error)
	}
	parts    func() []*partition // every assigned partition
	interval time.Duration
	everyN   int64
	clock    Clock
	log      *zap.Logger
	m        *metrics

	mu      sync.Mutex // serialises commits with revoke and shutdown
	aborted bool       // guarded by mu: no commit after a simulated crash

	since atomic.Int64  // finished since the last commit
	kick  chan struct{} // cap 1: a pending "commit now" is enough
	stop  chan struct{}
	done  chan struct{}
}

func (cm *committer) init(cfg config.KafkaConsumer, kc *kafka.Consumer, parts func() []*partition, clk Clock, log *zap.Logger, m *metrics) {
	cm.kc, cm.parts, cm.clock, cm.log, cm.m = kc, parts, clk, log, m
	cm.interval, cm.everyN = cfg.CommitInterval, int64(cfg.CommitEveryN)
	cm.kick, cm.stop, cm.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
}

// start runs the periodic commits until shutdown.
func (cm *committer) start() { go cm.loop() }

// shutdown stops the periodic commits and waits for the goroutine.
func (cm *committer) shutdown() {
	close(cm.stop)
	<-cm.done
}

// abort refuses every later commit (a simulated crash).
func (cm *committer) abort() {
	cm.mu.Lock()
	cm.aborted = true
	cm.mu.Unlock()
}

func (cm *committer) loop() {
	defer close(cm.done)
	tick := make(chan struct{}, 1)
	t := cm.clock.AfterFunc(cm.interval, func() {
		select {
		case tick <- struct{}{}:
		default:
		}
	})
	defer t.Stop()
	for {
		select {
		case <-cm.stop:
			return
		case <-tick:
			t.Reset(cm.interval)
		case <-cm.kick:
		}
		cm.since.Store(0)
		if err := cm.commit(nil); err != nil {
			cm.log.Warn("periodic commit", zap.Error(err))
		}
	}
}

// finish marks env's offset finished (handled, duplicate, or durably
// dead-lettered).
func (cm *committer) finish(env *envelope) {
	p, off := env.part, int64(env.km.TopicPartition.Offset)
	p.tracker.Done(off)
	if n := cm.since.Add(1); n >= cm.everyN {
		select {
		case cm.kick <- struct{}{}:
		default:
		}
	}
}

// commit commits the committable offsets of ps (all partitions when ps is
// nil) that moved since their last commit. It is synchronous; the periodic
// caller is the commit goroutine, so the poll loop never waits for it.
func (cm *committer) commit(ps []*partition) error {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.aborted {
		return nil
	}
	if ps == nil {
		ps = cm.parts()
	}
	var list []kafka.TopicPartition
	var moved []*partition
	var nexts []int64
	var metas []string
	for _, p := range ps {
		next, ok := p.tracker.Committable()
		above := p.tracker.FinishedAbove()
		if len(p.prior.offs) > 0 {
			// The previous owner's list holds until this owner has read
			// past it: a crash before then must not lose it.
			above = mergeAbove(above, p.prior.offs)
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
			cm.m.metaTruncated.Inc()
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
	res, err := cm.kc.CommitOffsets(list)
	if err == nil {
		for _, tp := range res {
			if tp.Error != nil {
				err = fmt.Errorf("partition %d: %w", tp.Partition, tp.Error)
				break
			}
		}
	}
	if err != nil {
		cm.m.commits.WithLabelValues("error").Inc()
		return fmt.Errorf("commit offsets: %w", err)
	}
	cm.m.commits.WithLabelValues("ok").Inc()
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
