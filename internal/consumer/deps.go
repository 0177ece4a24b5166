package consumer

import (
	"context"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// Reasons a message goes to the DLQ (I6): the wire values of the DLQ's
// reason field, taken from the reason table of package deadletter. They
// stay plain strings, as the metrics' labels are (a dead letter's
// Reason is the deadletter.Reason of the same name).
const (
	ReasonInvalidMessage  = string(deadletter.InvalidMessage)
	ReasonHandlerRejected = string(deadletter.HandlerRejected)
	ReasonCircuitOpen     = string(deadletter.CircuitOpen)
	ReasonRateLimited     = string(deadletter.RateLimited)
	ReasonUserBlocked     = string(deadletter.UserBlocked)
	ReasonQueueFull       = string(deadletter.QueueFull)
	ReasonDownstreamError = string(deadletter.DownstreamError)
	ReasonProcessTimeout  = string(deadletter.ProcessTimeout)
)

// State is the consumer's state store (I3): one lease per partition, taken
// when the partition is assigned and given back when it is revoked, and
// the done marks of the partition's messages. There is one implementation
// (package state, adapted in package service); tests use their own.
type State interface {
	// Acquire takes the partition's lease, waiting (bounded by ctx) while
	// a previous owner holds it and has neither given it back nor let it
	// expire.
	Acquire(ctx context.Context, topic string, partition int32) (Lease, error)
}

// LimitMemory keeps the handler limit (overload) a consumer group's
// members learnt, so that a member started or restarted in the fleet
// starts at the limit the downstream was carrying, not at
// overload.initial_limit: a rolling restart of consumers calling a bot
// that answers in 5–30 s otherwise begins every member's climb again
// (state.Store keeps it in Redis).
type LimitMemory interface {
	// LoadLimit returns the limit saved under name, 0 when none is.
	LoadLimit(ctx context.Context, name string) (int, error)
	// SaveLimit saves n under name for ttl.
	SaveLimit(ctx context.Context, name string, n int, ttl time.Duration) error
}

// Lease is one owner's hold on a partition in the State, from Acquire to
// Release or its loss.
type Lease interface {
	// Token is the fencing token: larger than every token handed out for
	// the partition before (handlers read it with handler.FencingToken).
	Token() int64
	// Lost is closed when the lease is lost (not renewed in time, or
	// another owner took it).
	Lost() <-chan struct{}
	// Seen reports which items are done; it reads the store, never a
	// copy.
	Seen(ctx context.Context, items []StateItem) ([]bool, error)
	// Mark records it as done (batched with the partition's other marks).
	// done is called once, from any goroutine: recorded true when the
	// mark is in the store — also when the lease has moved meanwhile: an
	// effect that happened is a fact, whoever owns the partition now —
	// and false when it was given up (the consumer stops, or Redis stayed
	// unreachable past the store's retries).
	Mark(it StateItem, offset int64, done func(recorded bool))
	// The message's replies are recorded beside its marks, under the same
	// ownership.
	ReplyLog
	// Release sends the marks still queued, then gives the lease back so
	// the next owner need not wait for its expiry.
	Release(ctx context.Context) error
}

// Verdict is a Limiter's answer for one message.
type Verdict struct {
	Allowed bool
	// Reason is ReasonRateLimited or ReasonUserBlocked when not allowed;
	// empty means ReasonRateLimited.
	Reason string
	// Details is a human-readable explanation recorded in the dead letter.
	Details string
}

// Limiter is the per-user sliding-window limiter (I5). It is called
// from the consumer's single dispatch goroutine, in partition order, so it
// must answer from memory (no network round trip on the hot path).
type Limiter interface {
	Allow(ctx context.Context, user string, now time.Time) Verdict
}

// Prefetcher is implemented by a Limiter that keeps per-user state in a
// store. Before deciding any record of a polled batch the dispatcher hands
// it the batch's users, so the reads of users it does not know yet share
// one round trip instead of blocking the dispatcher once per new user.
// Prefetch must leave every user it was given answerable by Allow from
// memory — including a block recorded in the store, which must refuse the
// user's first message — or, when the store fails, fail the way Allow does.
type Prefetcher interface {
	Prefetch(ctx context.Context, users []string, now time.Time)
}

// Breaker is the per-user circuit breaker. Allow returns a non-nil error
// when the user's breaker is open; otherwise done must be called once with
// the outcome of the message (true: handled or duplicate; false: mailbox
// full, handler failed or panicked). done is not called for a message the
// limiter refused: that is neither a success nor a failure of the user's
// processing.
type Breaker interface {
	Allow(user string) (done func(success bool), err error)
}

// Forgetter is implemented by a Limiter or Breaker that keeps per-user
// state in memory: the consumer calls Forget when the user's actor ends
// after its idle timeout, so that state lives as long as the actor and not
// as long as the process (every user ever seen, ~384 B each).
type Forgetter interface {
	Forget(user string)
}

// DeadLetters sends dead letters (the DLQ topic's record, built here from
// the main-topic record given up on) asynchronously. done(nil) means the dead
// letter is durable (acknowledged by Kafka or fsync'd to the emergency
// file); only then does the consumer count the message finished and let
// its offset be committed. done(err) means it is not durable; the consumer
// sends it again after a backoff. Send may block while the sender's own
// queue is full, but must return: the consumer calls it only from the
// letter's partition's dead-letter goroutine, which Close waits for.
type DeadLetters interface {
	Send(dl *chatmsg.DeadLetter, done func(error))
}

// Clock is the time source (Now, and AfterFunc: f in its own goroutine
// after d); tests may inject their own.
type Clock = clock.TimerClock

// Timer is a stoppable, resettable timer from Clock.AfterFunc.
type Timer = clock.Timer

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// sleep waits d on clock or until ctx is done; it reports whether the full
// time elapsed.
func sleep(ctx context.Context, clock Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	ch := make(chan struct{})
	t := clock.AfterFunc(d, func() { close(ch) })
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}
