package consumer

import (
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
