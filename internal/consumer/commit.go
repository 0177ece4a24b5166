package consumer

// Commits: the contiguous finished prefix of each partition, with the
// finished offsets behind it in the commit's metadata.

import (
	"errors"
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/offsets"
)

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
	if c.aborted {
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
	p.tracker.Done(off)
	if n := c.sinceCommit.Add(1); n >= int64(c.cfg.Kafka.Consumer.CommitEveryN) {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}
