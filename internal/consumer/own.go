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

	"github.com/kfpipe/kfpipe/internal/handler"
)

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

// partWork is a partition's running handler attempts. The zero value is
// open and idle.
type partWork struct {
	mu      sync.Mutex
	closed  bool // no new attempt: the partition is being handed over
	next    int
	cancels map[int]context.CancelFunc
	holds   map[int]bool  // entries of cancels that are messages, not attempts
	idle    chan struct{} // closed when the last attempt ends (nil: none waits)
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

// cancel cancels the running attempts' contexts; it returns how many.
func (w *partWork) cancel() int {
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
func (c *Consumer) endWork(ps []*partition, limit time.Duration) (unended map[*partition]bool, st handOverStats) {
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
		n := p.work.cancel()
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
		c.m.own.add(st)
	}
	return unended, st
}

// startAttempt is the ownership check at the start of an attempt of env:
// it returns the attempt's context (bounded by processor.attempt_timeout,
// cancelled when the claim is lost or the partition handed over), or
// errStopping when the partition is being handed over, errClaimLost when
// the lease is past its local deadline or lost: the attempt does not
// start and the message is looked up again under the next lease (nothing
// is dead-lettered for it).
func (c *Consumer) startAttempt(ctx context.Context, env *envelope, g *claimGuard) (context.Context, context.CancelFunc, error) {
	if err := handler.CheckOwner(ctx); err != nil {
		c.m.own.notOwner.Inc()
		return nil, nil, errClaimLost
	}
	actx, cancel, ok := g.attempt(ctx, c.cfg.Processor.AttemptTimeout)
	if !ok {
		return nil, nil, errClaimLost
	}
	id, ok := env.part.work.begin(cancel)
	if !ok {
		cancel()
		return nil, nil, errStopping
	}
	return actx, func() {
		cancel()
		env.part.work.end(id)
	}, nil
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
	m.handOver.WithLabelValues("awaited").Add(float64(st.awaited))
	m.handOver.WithLabelValues("cancelled").Add(float64(st.cancelled))
	m.handOver.WithLabelValues("lapsed").Add(float64(st.lapsed))
}

// errStopping means the consumer is stopping: the message is left
// unfinished, so its offset is not committed and it is read again.
var errStopping = errors.New("consumer stopping")

// errClaimLost means the message's dedup claim was lost while the handler
// ran (it expired, or another owner took the key): the handler was stopped
// and the message is looked at again under the dedup protocol, which waits
// for the other owner's outcome.
var errClaimLost = errors.New("dedup claim lost while the handler ran")

// claimGuard stops a message's handler when its dedup claim is lost
// (AheadDeduper's lost callback), so the message needs no context of its
// own besides each attempt's.
type claimGuard struct {
	mu     sync.Mutex
	lost   bool
	cancel context.CancelFunc // the running attempt's, if any
}

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
