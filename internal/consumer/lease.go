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

// releaseLeases stops the lease keepers of ps and gives their leases back
// (after their last commit: the next owner starts where it ended).
func (c *Consumer) releaseLeases(ps []*partition) {
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
