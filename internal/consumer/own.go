package consumer

// Ownership: a partition's in-flight work belongs to its lease. Every
// handler attempt of a partition is registered with the partition's work
// while it runs; a revoke (or a stop) closes the work to new attempts,
// waits for the running ones up to kafka.consumer.revoke_drain_limit,
// cancels those still running and waits for them once more; only a lease
// whose work has ended is given back, any other lapses. Before every
// attempt and every reply, the owner checks its lease's local deadline
// (minus a margin): past it, nothing starts.

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// ownership is the consumer's assigned partitions and each one's lease:
// a partition's lease keeper takes the lease on assignment (waiting for
// the previous owner to give it back or let it expire), and a hand-over
// ends the work under it (own.go) before it gives the lease back. The
// poll goroutine adds and removes partitions (rebalance.go) and reads
// parts without the lock; every other reader takes mu.
type ownership struct {
	*core
	state State
	mu    sync.Mutex
	parts map[tpKey]*partition
	// handingOver holds, per revoked partition whose hand-over still runs,
	// a channel closed when it ended (guarded by mu); handOvers counts
	// those hand-overs (Close waits for them).
	handingOver map[tpKey]chan struct{}
	handOvers   sync.WaitGroup
}

// snapshot returns the assigned partitions.
func (o *ownership) snapshot() []*partition {
	o.mu.Lock()
	defer o.mu.Unlock()
	ps := make([]*partition, 0, len(o.parts))
	for _, p := range o.parts {
		ps = append(ps, p)
	}
	return ps
}

// startLease gives p its lease keeper (no-op without a State).
func (o *ownership) startLease(p *partition) {
	if o.state == nil {
		return
	}
	pl := &partLease{ready: make(chan struct{}), pending: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	p.lease = pl
	go o.keepLease(p, pl)
}

func (o *ownership) keepLease(p *partition, pl *partLease) {
	defer close(pl.done)
	if p.after != nil {
		// This consumer handed the partition over a moment ago and its
		// work there has not ended: the lease, which the store would give
		// back to the same owner at once, waits for it.
		select {
		case <-p.after:
		case <-pl.stop:
			return
		case <-o.runCtx.Done():
			return
		}
	}
	backoff := o.cfg.Processor.RetryBase
	for {
		ctx, cancel := context.WithCancel(o.runCtx)
		go func() {
			select {
			case <-pl.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		t0 := time.Now()
		l, err := o.state.Acquire(ctx, p.topic, p.id)
		cancel()
		if err != nil {
			select {
			case <-pl.stop:
				return
			case <-o.runCtx.Done():
				return
			default:
			}
			o.log.Warn("state: partition lease not taken; trying again", zap.Int32("partition", p.id), zap.Error(err))
			select {
			case <-pl.stop:
				return
			case <-o.runCtx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff+time.Millisecond, max(o.cfg.Processor.RetryMax, time.Millisecond))
			continue
		}
		backoff = o.cfg.Processor.RetryBase
		pl.mu.Lock()
		pl.cur = l
		close(pl.ready)
		pl.mu.Unlock()
		o.log.Info("partition lease taken", zap.Int32("partition", p.id), zap.Int64("token", l.Token()),
			zap.Duration("waited", time.Since(t0)))
		select {
		case <-pl.stop:
			return // the revoke gives it back
		case <-o.runCtx.Done():
			return
		case <-l.Lost():
		}
		o.log.Warn("partition lease lost; taking it again (handlers under it are stopped, their messages looked up again)",
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
func (o *ownership) leaseOf(pl *partLease) (Lease, bool) {
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
		case <-o.runCtx.Done():
			return nil, false
		}
	}
}

// handOver ends ps's work (own.go: await up to limit, cancel, await) and
// then gives their leases back, or lets lapse those whose work did not
// end.
func (o *ownership) handOver(ps []*partition, limit time.Duration) {
	unended, st := o.endWork(ps, limit)
	if st != (handOverStats{}) {
		o.log.Info("hand-over: running handler attempts ended", zap.Int("awaited", st.awaited),
			zap.Int("cancelled", st.cancelled), zap.Int("left_to_lapsing_lease", st.lapsed))
	}
	o.releaseLeases(ps, unended)
}

// handOverAsync runs handOver on a goroutine of its own; until it ended,
// a new assignment of one of ps to this consumer waits for it.
func (o *ownership) handOverAsync(ps []*partition, limit time.Duration) {
	done := make(chan struct{})
	o.mu.Lock()
	if o.handingOver == nil {
		o.handingOver = map[tpKey]chan struct{}{}
	}
	for _, p := range ps {
		o.handingOver[tpKey{p.topic, p.id}] = done
	}
	o.mu.Unlock()
	o.handOvers.Add(1)
	go func() {
		defer o.handOvers.Done()
		defer close(done)
		o.handOver(ps, limit)
		o.mu.Lock()
		for _, p := range ps {
			if k := (tpKey{p.topic, p.id}); o.handingOver[k] == done {
				delete(o.handingOver, k)
			}
		}
		o.mu.Unlock()
	}()
}

// releaseLeases stops the lease keepers of ps and gives their leases back
// (after their last commit: the next owner starts where it ended) — except
// the leases of the partitions in lapse, whose work may still run: those
// stop renewing and run out at their deadline.
func (o *ownership) releaseLeases(ps []*partition, lapse map[*partition]bool) {
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
				o.log.Warn("handler attempts still running after their cancel: the partition lease is left to lapse, not given back",
					zap.Int32("partition", p.id), zap.Int("running", p.work.running()))
				if lp, ok := l.(lapser); ok {
					lp.Lapse()
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				o.log.Warn("state: give the partition lease back (the next owner waits for its expiry)",
					zap.Int32("partition", p.id), zap.Error(err))
			}
		}()
	}
	wg.Wait()
}

// deadliner is implemented by a Lease that knows its local deadline (the
// state store's does): until then it is certainly held.
type deadliner interface {
	Deadline() time.Time
}

// lapser is implemented by a Lease that can stop renewing without being
// given back: it then runs out at its deadline, and the next owner takes
// it after the store's grace. The consumer lets a lease lapse when work
// under it may still run.
type lapser interface {
	Lapse()
}

// ownerMargin is how long before its lease's local deadline an owner stops
// starting attempts and replies: what a request may spend between the
// check and its arrival downstream. A tenth of the lease (1 s with the
// default 10 s lease), at most a second.
func ownerMargin(lease time.Duration) time.Duration {
	if lease <= 0 {
		return 0
	}
	return min(lease/10, time.Second)
}

// begin registers an attempt whose context cancel ends; ok is false once
// the work is closed.
func (w *partWork) begin(cancel context.CancelFunc) (id int, ok bool) {
	return w.add(cancel, false)
}

// hold registers a message from its look-up until its mark is queued (its
// retries' waits included), which the lease must cover too; cancel ends
// its context.
func (w *partWork) hold(cancel context.CancelFunc) (id int, ok bool) {
	return w.add(cancel, true)
}

func (w *partWork) add(cancel context.CancelFunc, hold bool) (id int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, false
	}
	if w.cancels == nil {
		w.cancels, w.holds = map[int]context.CancelFunc{}, map[int]bool{}
	}
	w.next++
	w.cancels[w.next] = cancel
	if hold {
		w.holds[w.next] = true
	}
	return w.next, true
}

func (w *partWork) end(id int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.cancels, id)
	delete(w.holds, id)
	if len(w.cancels) == 0 && w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
}

// close stops new attempts.
func (w *partWork) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// running returns the attempts running now.
func (w *partWork) running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.cancels) - len(w.holds)
}

// busy returns the attempts and messages the lease still covers.
func (w *partWork) busy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.cancels)
}

// cancelAll cancels the running attempts' contexts; it returns how many.
func (w *partWork) cancelAll() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancels {
		c()
	}
	return len(w.cancels) - len(w.holds)
}

// wait waits until no attempt runs, at most d; it reports whether none
// runs.
func (w *partWork) wait(d time.Duration) bool {
	w.mu.Lock()
	if len(w.cancels) == 0 {
		w.mu.Unlock()
		return true
	}
	if w.idle == nil {
		w.idle = make(chan struct{})
	}
	idle := w.idle
	w.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return w.busy() == 0
	}
}

// cancelWait is how long, after the drain limit, cancelled attempts are
// awaited before their partition's lease is left to lapse.
const cancelWait = 2 * time.Second

// handOverStats counts what the hand-overs did with running attempts.
type handOverStats struct{ awaited, cancelled, lapsed int }

// endWork closes ps's work to new attempts, waits up to limit for the
// running ones, cancels what still runs and waits up to cancelWait more.
// It returns the partitions whose work did not end (their leases must
// lapse) and what it did.
func (o *ownership) endWork(ps []*partition, limit time.Duration) (unended map[*partition]bool, st handOverStats) {
	for _, p := range ps {
		p.work.close()
	}
	deadline := time.Now().Add(limit)
	for _, p := range ps {
		n := p.work.running()
		if p.work.wait(time.Until(deadline)) {
			st.awaited += n
		}
	}
	var cut []*partition
	for _, p := range ps {
		n := p.work.cancelAll()
		st.cancelled += n
		if n > 0 || p.work.busy() > 0 {
			cut = append(cut, p)
		}
	}
	deadline = time.Now().Add(cancelWait)
	for _, p := range cut {
		if !p.work.wait(time.Until(deadline)) {
			if unended == nil {
				unended = map[*partition]bool{}
			}
			unended[p] = true
			st.lapsed += p.work.running()
		}
	}
	if st.awaited+st.cancelled > 0 {
		o.m.own.add(st)
	}
	return unended, st
}

// watchDeadline cancels g's attempt when l reaches its local deadline
// without a renewal (or is lost); it returns when stop is closed.
func watchDeadline(l Lease, g *claimGuard, stop <-chan struct{}) {
	d, ok := l.(deadliner)
	var at <-chan time.Time
	if ok {
		t := time.NewTimer(time.Until(d.Deadline()))
		defer t.Stop()
		at = t.C
		defer func() { at = nil }()
	}
	for {
		select {
		case <-l.Lost():
			g.lose(nil)
			return
		case <-stop:
			return
		case <-at:
			// Renewed meanwhile: wait for the new deadline.
			if left := time.Until(d.Deadline()); left > 0 {
				t := time.NewTimer(left)
				at = t.C
				defer t.Stop()
				continue
			}
			g.lose(nil)
			return
		}
	}
}

func (m ownMetrics) add(st handOverStats) {
	m.handedOver.WithLabelValues("awaited").Add(float64(st.awaited))
	m.handedOver.WithLabelValues("cancelled").Add(float64(st.cancelled))
	m.handedOver.WithLabelValues("lapsed").Add(float64(st.lapsed))
}

// errStopping means the consumer is stopping: the message is left
// unfinished, so its offset is not committed and it is read again.
var errStopping = errors.New("consumer stopping")

// errClaimLost means the message's dedup claim was lost while the handler
// ran (it expired, or another owner took the key): the handler was stopped
// and the message is looked at again under the dedup protocol, which waits
// for the other owner's outcome.
var errClaimLost = errors.New("dedup claim lost while the handler ran")

func (g *claimGuard) lose(error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lost = true
	if g.cancel != nil {
		g.cancel()
	}
}

// attempt returns the context of one handler attempt; ok is false when the
// claim is already lost. A nil guard only bounds the attempt.
func (g *claimGuard) attempt(ctx context.Context, d time.Duration) (_ context.Context, _ context.CancelFunc, ok bool) {
	actx, cancel := context.WithTimeout(ctx, d)
	if g == nil {
		return actx, cancel, true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost {
		cancel()
		return nil, nil, false
	}
	g.cancel = cancel
	return actx, cancel, true
}

// ended reports, after an attempt, whether the claim was lost.
func (g *claimGuard) ended() (lost bool) {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cancel = nil
	return g.lost
}
