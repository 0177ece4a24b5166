package consumer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Actor states: Active accepts messages; Dying is the short
// moment, under the actor's lock, between deciding to die and leaving the
// registry; Dead never accepts a message again.
const (
	stateActive uint32 = iota
	stateDying
	stateDead
)

// envelope is one message on its way through a user's actor.
type envelope struct {
	km *kafka.Message
	// msg is the decoded record: set by the actor (or by the dispatcher for
	// a record without key); nil when the record is not decoded yet or
	// could not be decoded.
	msg  *chatmsg.ChatMessage
	user string // the routing user: the record key, else msg.ExternalUserID
	part *partition
	// breakerDone reports the outcome to the user's breaker; nil when no
	// breaker is configured.
	breakerDone func(success bool)
	// prepared: the actor has handed the envelope to registry.prepare
	// (written under the actor's lock).
	prepared bool
	// guard stops the handler when the partition's lease is lost (part of
	// the envelope to save an allocation per message).
	guard claimGuard
}

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
