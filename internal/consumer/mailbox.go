package consumer

// The mailboxes: the registry of per-user actors, each actor's bounded
// mailbox and its drain, and the workers that run the drains.

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// registry maps external_userid to its actor. Actors register themselves
// through LoadOrStore and remove themselves with CompareAndDelete when
// idle; nothing else deletes them except shutdown.
type registry struct {
	actors  sync.Map // string -> *actor
	mailbox int
	idle    time.Duration
	clock   Clock
	handle  func(*envelope) // called from the actor's goroutine
	onCount func(delta int) // active processor gauge; may be nil
	// onIdle, when set, is called with the user of an actor that ended
	// after its idle timeout (from the actor's timer goroutine).
	onIdle func(user string)
	// prepare, when set, is called from the actor's goroutine with up to
	// ahead of the mailbox's next envelopes, each once, before handle is
	// called for the first of them (claim ahead).
	prepare func([]*envelope)
	ahead   int
	// batch, when batch.max > 1, makes the actors hand their users'
	// consecutive messages to batch.handle together (batch.go).
	batch batchMode

	workers *workers       // goroutines that drain mailboxes
	wg      sync.WaitGroup // running drains
	count   atomic.Int64
	closed  atomic.Bool
}

func newRegistry(mailbox int, idle time.Duration, clock Clock, handle func(*envelope), onCount func(int)) *registry {
	if clock == nil {
		clock = realClock{}
	}
	return &registry{mailbox: mailbox, idle: idle, clock: clock, handle: handle, onCount: onCount,
		workers: newWorkers(1024, time.Second)}
}

// send puts env into user's mailbox, creating the actor when there is none
// or the registered one is dying. It returns false when the mailbox is full
// or the registry is closed.
func (r *registry) send(user string, env *envelope) bool {
	for !r.closed.Load() {
		v, ok := r.actors.Load(user)
		if !ok {
			fresh := &actor{user: user, reg: r}
			var loaded bool
			if v, loaded = r.actors.LoadOrStore(user, fresh); !loaded {
				r.count.Add(1)
				if r.onCount != nil {
					r.onCount(1)
				}
			}
		}
		a := v.(*actor)
		switch a.enqueue(env) {
		case enqueued:
			return true
		case mailboxFull:
			return false
		case actorGone:
			// It decided to die with an empty mailbox; help it leave the
			// registry (a no-op if it already did) and make a fresh one.
			r.actors.CompareAndDelete(user, a)
		}
	}
	return false
}

func (r *registry) died() {
	r.count.Add(-1)
	if r.onCount != nil {
		r.onCount(-1)
	}
}

// len returns the number of live actors.
func (r *registry) len() int { return int(r.count.Load()) }

// close refuses further sends, kills every actor and waits for their
// goroutines. The caller makes the handler return promptly (by cancelling
// its context) when it does not want to wait for the mailboxes to drain.
func (r *registry) close() {
	r.closed.Store(true)
	var all []*actor
	r.actors.Range(func(_, v any) bool {
		all = append(all, v.(*actor))
		return true
	})
	for _, a := range all {
		a.kill()
		r.actors.CompareAndDelete(a.user, a)
	}
	r.wg.Wait()
	r.workers.close()
}

// Actor states: Active accepts messages; Dying is the short
// moment, under the actor's lock, between deciding to die and leaving the
// registry; Dead never accepts a message again.
const (
	stateActive uint32 = iota
	stateDying
	stateDead
)

// actor is the self-managing processor of one external_userid (I4, I5).
//
// It owns no goroutine while idle: enqueue starts one when the mailbox goes
// from empty to non-empty and that goroutine exits when the mailbox is
// empty again. An idle actor is therefore a few hundred bytes (a lock, an
// empty queue and an idle timer), which is what lets a node keep 100k known
// users (measured by TestActorMemory).
//
// The send/die race (a message sent to an actor that is deciding to die) is
// closed by the actor's mutex:
// enqueue and the decision to die both happen under mu, and an actor only
// decides to die with an empty mailbox and no running goroutine. So a
// message is either in this actor's mailbox before it dies, and is handled
// by it, or is refused and goes to a fresh actor; a dying actor never holds
// a message, so the fresh actor cannot overtake an older message (I4).
type actor struct {
	user string
	reg  *registry

	mu      sync.Mutex
	state   atomic.Uint32 // written under mu; read without it by observers
	running bool          // a goroutine is draining the mailbox
	queue   []*envelope   // mailbox; queue[head:] are pending
	head    int
	idleAt  time.Time // when the mailbox last became empty
	timer   Timer     // idle expiry; nil until the first message is done
	// full, in batch mode, is signalled while the actor waits for a
	// batch to fill (batch.go): by enqueue when the batch is full, by the
	// wait's timer and by kill.
	full chan struct{}
}

type enqueueResult int

const (
	enqueued enqueueResult = iota
	mailboxFull
	actorGone
)

// enqueue appends env to the mailbox, starting the actor's goroutine when
// it is not running.
func (a *actor) enqueue(env *envelope) enqueueResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.Load() != stateActive {
		return actorGone
	}
	if len(a.queue)-a.head >= a.reg.mailbox {
		return mailboxFull
	}
	a.queue = append(a.queue, env)
	if a.full != nil && len(a.queue)-a.head >= a.reg.batch.max {
		a.wake()
	}
	if !a.running {
		a.running = true
		a.reg.wg.Add(1)
		a.reg.workers.run(a)
	}
	return enqueued
}

// run handles the mailbox until it is empty, then arms the idle timer and
// exits.
func (a *actor) run() {
	defer a.reg.wg.Done()
	for {
		a.mu.Lock()
		if a.head == len(a.queue) {
			// Keep a small backing array for the next burst, drop a
			// large one so a burst does not pin memory while idle.
			if cap(a.queue) > 8 {
				a.queue = nil
			} else {
				clear(a.queue)
				a.queue = a.queue[:0]
			}
			a.head = 0
			a.running = false
			a.idleAt = a.reg.clock.Now()
			if a.state.Load() == stateActive {
				if a.timer == nil {
					a.timer = a.reg.clock.AfterFunc(a.reg.idle, a.expire)
				} else {
					a.timer.Reset(a.reg.idle)
				}
			}
			a.mu.Unlock()
			return
		}
		if a.reg.batch.max > 1 {
			a.runBatch() // unlocks
			continue
		}
		env := a.queue[a.head]
		if a.reg.prepare != nil && !env.prepared {
			// Claim ahead: hand the next unprepared messages of the
			// mailbox to prepare together, then handle them one by one.
			end := min(len(a.queue), a.head+a.reg.ahead)
			window := make([]*envelope, 0, end-a.head)
			for _, e := range a.queue[a.head:end] {
				if !e.prepared {
					e.prepared = true
					window = append(window, e)
				}
			}
			a.mu.Unlock()
			a.reg.prepare(window)
			continue
		}
		a.queue[a.head] = nil
		a.head++
		a.mu.Unlock()
		a.reg.handle(env)
	}
}

// expire runs when the idle timer fires: an actor idle for the whole idle
// timeout leaves the registry and dies; a busy one lets run re-arm it.
func (a *actor) expire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.Load() != stateActive || a.running || a.head < len(a.queue) {
		return
	}
	if left := a.reg.idle - a.reg.clock.Now().Sub(a.idleAt); left > 0 {
		a.timer.Reset(left)
		return
	}
	a.state.Store(stateDying)
	// CompareAndDelete: a fresh actor for the same user may already be
	// registered (after a refused send); it must stay.
	a.reg.actors.CompareAndDelete(a.user, a)
	a.state.Store(stateDead)
	a.reg.died()
	if a.reg.onIdle != nil {
		a.reg.onIdle(a.user)
	}
}

// kill marks the actor dead at shutdown; pending messages stay unhandled
// (their offsets are not finished, so they are not committed).
func (a *actor) kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.Load() == stateDead {
		return
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	a.state.Store(stateDead)
	a.wake()
	a.reg.died()
}

// batchMode is how the actors take batches off their mailboxes (WithBatch,
// batch.go): at most max messages, waiting up to wait for more; handle
// gets each batch.
type batchMode struct {
	max    int
	wait   time.Duration
	handle func([]*envelope)
}

// wake signals a batch wait (called under a.mu).
func (a *actor) wake() {
	if a.full != nil {
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

// runBatch takes the next batch off the mailbox and handles it. It is
// called from run with a.mu held and the mailbox not empty, and returns
// with a.mu unlocked.
func (a *actor) runBatch() {
	b := &a.reg.batch
	if len(a.queue)-a.head < b.max && b.wait > 0 && a.state.Load() == stateActive {
		full := make(chan struct{}, 1)
		a.full = full
		a.mu.Unlock()
		t := a.reg.clock.AfterFunc(b.wait, func() {
			select {
			case full <- struct{}{}:
			default:
			}
		})
		<-full
		t.Stop()
		a.mu.Lock()
		a.full = nil
	}
	first := a.queue[a.head]
	end := a.head + 1
	for end < len(a.queue) && end-a.head < b.max && a.queue[end].part == first.part {
		end++
	}
	batch := make([]*envelope, end-a.head)
	copy(batch, a.queue[a.head:end])
	clear(a.queue[a.head:end])
	a.head = end
	a.mu.Unlock()
	b.handle(batch)
}

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
