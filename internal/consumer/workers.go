package consumer

import (
	"slices"
	"sync"
	"time"
)

// workers runs actors' drains (actor.run) on reusable goroutines. An actor
// owns no goroutine while idle, so under load actors start and finish
// drains all the time; a fresh goroutine for each drain would start on a
// small stack and grow it again by copying on every burst. A worker that
// finishes a drain parks for a while instead and takes the next actor
// that needs one. Parked workers are capped and leave after linger, so an
// idle node holds none (TestActorMemory).
type workers struct {
	linger time.Duration
	max    int

	mu     sync.Mutex
	idle   []*worker // parked, most recently parked last
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup // every worker goroutine
}

type worker struct {
	p     *workers
	next  chan *actor // the actor to drain next; room for one
	timer *time.Timer
}

func newWorkers(max int, linger time.Duration) *workers {
	return &workers{max: max, linger: linger, stop: make(chan struct{})}
}

// run drains a on a parked worker, or on a new one when none is parked.
func (p *workers) run(a *actor) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.next <- a
		return
	}
	p.mu.Unlock()
	w := &worker{p: p, next: make(chan *actor, 1)}
	p.wg.Add(1)
	go w.loop(a)
}

func (w *worker) loop(a *actor) {
	p := w.p
	defer p.wg.Done()
	for {
		a.run()
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.max {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		if w.timer == nil {
			w.timer = time.NewTimer(p.linger)
		} else {
			w.timer.Reset(p.linger)
		}
		select {
		case a = <-w.next:
			w.timer.Stop()
			continue
		case <-w.timer.C:
		case <-p.stop:
		}
		// Leave the parked list, unless run took this worker meanwhile:
		// then its actor is on the way and must be drained.
		p.mu.Lock()
		if i := slices.Index(p.idle, w); i >= 0 {
			p.idle = slices.Delete(p.idle, i, i+1)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		a = <-w.next
	}
}

// close makes parked workers leave now and working ones when they finish,
// and waits for them (the registry has stopped every actor by then).
func (p *workers) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
