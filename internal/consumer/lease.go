package consumer

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// partLease is an assigned partition's hold in the State: its keeper
// goroutine takes the partition's lease on assignment (waiting for the
// previous owner to give it back or let it expire), takes it again when it
// is lost, and stops on revoke, when the consumer gives it back after the
// last commit.
type partLease struct {
	mu    sync.Mutex
	cur   Lease         // nil while the lease is being taken
	ready chan struct{} // closed when cur is set
	// pending counts the keys handled by this consumer whose done marks
	// are not recorded yet: a copy of such a message is a duplicate (the
	// store would not know it yet).
	pending map[string]int
	stop    chan struct{} // closed on revoke
	done    chan struct{} // closed when the keeper returned
}

// startLease gives p its lease keeper (no-op without a State).
func (c *Consumer) startLease(p *partition) {
	if c.state == nil {
		return
	}
	pl := &partLease{ready: make(chan struct{}), pending: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	p.lease = pl
	go c.keepLease(p, pl)
}

func (c *Consumer) keepLease(p *partition, pl *partLease) {
	defer close(pl.done)
	if p.after != nil {
		// This consumer handed the partition over a moment ago and its
		// work there has not ended: the lease, which the store would give
		// back to the same owner at once, waits for it.
		select {
		case <-p.after:
		case <-pl.stop:
			return
		case <-c.runCtx.Done():
			return
		}
	}
	backoff := c.cfg.Processor.RetryBase
	for {
		ctx, cancel := context.WithCancel(c.runCtx)
		go func() {
			select {
			case <-pl.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		t0 := time.Now()
		l, err := c.state.Acquire(ctx, p.topic, p.id)
		cancel()
		if err != nil {
			select {
			case <-pl.stop:
				return
			case <-c.runCtx.Done():
				return
			default:
			}
			c.log.Warn("state: partition lease not taken; trying again", zap.Int32("partition", p.id), zap.Error(err))
			select {
			case <-pl.stop:
				return
			case <-c.runCtx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff+time.Millisecond, max(c.cfg.Processor.RetryMax, time.Millisecond))
			continue
		}
		backoff = c.cfg.Processor.RetryBase
		pl.mu.Lock()
		pl.cur = l
		close(pl.ready)
		pl.mu.Unlock()
		c.log.Info("partition lease taken", zap.Int32("partition", p.id), zap.Int64("token", l.Token()),
			zap.Duration("waited", time.Since(t0)))
		select {
		case <-pl.stop:
			return // the revoke gives it back
		case <-c.runCtx.Done():
			return
		case <-l.Lost():
		}
		c.log.Warn("partition lease lost; taking it again (handlers under it are stopped, their messages looked up again)",
			zap.Int32("partition", p.id), zap.Int64("token", l.Token()))
		pl.mu.Lock()
		pl.cur, pl.ready = nil, make(chan struct{})
		pl.mu.Unlock()
		go func() {
			// Sends the marks still queued (they are recorded whoever owns
			// the partition now).
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = l.Release(ctx)
		}()
	}
}

// leaseOf waits for env's partition's lease; ok is false when the partition
// was revoked or the consumer stops meanwhile.
func (c *Consumer) leaseOf(pl *partLease) (Lease, bool) {
	for {
		pl.mu.Lock()
		l, ready := pl.cur, pl.ready
		pl.mu.Unlock()
		if l != nil {
			return l, true
		}
		select {
		case <-ready:
		case <-pl.stop:
			return nil, false
		case <-c.runCtx.Done():
			return nil, false
		}
	}
}

func (pl *partLease) isPending(key string) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.pending[key] > 0
}

func (pl *partLease) addPending(key string) {
	pl.mu.Lock()
	pl.pending[key]++
	pl.mu.Unlock()
}

func (pl *partLease) donePending(key string) {
	pl.mu.Lock()
	if pl.pending[key]--; pl.pending[key] <= 0 {
		delete(pl.pending, key)
	}
	pl.mu.Unlock()
}

// handOver ends ps's work (own.go: await up to limit, cancel, await) and
// then gives their leases back, or lets lapse those whose work did not
// end.
func (c *Consumer) handOver(ps []*partition, limit time.Duration) {
	unended, st := c.endWork(ps, limit)
	if st != (handOverStats{}) {
		c.log.Info("hand-over: running handler attempts ended", zap.Int("awaited", st.awaited),
			zap.Int("cancelled", st.cancelled), zap.Int("left_to_lapsing_lease", st.lapsed))
	}
	c.releaseLeases(ps, unended)
}

// handOverAsync runs handOver on a goroutine of its own; until it ended,
// a new assignment of one of ps to this consumer waits for it.
func (c *Consumer) handOverAsync(ps []*partition, limit time.Duration) {
	done := make(chan struct{})
	c.mu.Lock()
	if c.handingOver == nil {
		c.handingOver = map[tpKey]chan struct{}{}
	}
	for _, p := range ps {
		c.handingOver[tpKey{p.topic, p.id}] = done
	}
	c.mu.Unlock()
	c.handOvers.Add(1)
	go func() {
		defer c.handOvers.Done()
		defer close(done)
		c.handOver(ps, limit)
		c.mu.Lock()
		for _, p := range ps {
			if k := (tpKey{p.topic, p.id}); c.handingOver[k] == done {
				delete(c.handingOver, k)
			}
		}
		c.mu.Unlock()
	}()
}

// releaseLeases stops the lease keepers of ps and gives their leases back
// (after their last commit: the next owner starts where it ended) — except
// the leases of the partitions in lapse, whose work may still run: those
// stop renewing and run out at their deadline.
func (c *Consumer) releaseLeases(ps []*partition, lapse map[*partition]bool) {
	var wg sync.WaitGroup
	for _, p := range ps {
		pl := p.lease
		if pl == nil {
			continue
		}
		select {
		case <-pl.stop:
			continue
		default:
		}
		close(pl.stop)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-pl.done
			pl.mu.Lock()
			l := pl.cur
			pl.cur = nil
			pl.mu.Unlock()
			if l == nil {
				return
			}
			if lapse[p] {
				c.log.Warn("handler attempts still running after their cancel: the partition lease is left to lapse, not given back",
					zap.Int32("partition", p.id), zap.Int("running", p.work.running()))
				if lp, ok := l.(lapser); ok {
					lp.Lapse()
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				c.log.Warn("state: give the partition lease back (the next owner waits for its expiry)",
					zap.Int32("partition", p.id), zap.Error(err))
			}
		}()
	}
	wg.Wait()
}
