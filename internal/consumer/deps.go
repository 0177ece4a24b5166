package consumer

import (
	"context"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// Reasons a message goes to the DLQ (I6): the wire values of the DLQ's
// reason field, taken from the reason table of package deadletter. They
// stay plain strings because DeadLetter.Reason and the metrics' labels are.
const (
	ReasonInvalidMessage  = string(deadletter.InvalidMessage)
	ReasonCircuitOpen     = string(deadletter.CircuitOpen)
	ReasonRateLimited     = string(deadletter.RateLimited)
	ReasonUserBlocked     = string(deadletter.UserBlocked)
	ReasonQueueFull       = string(deadletter.QueueFull)
	ReasonDownstreamError = string(deadletter.DownstreamError)
	ReasonProcessTimeout  = string(deadletter.ProcessTimeout)
)

// Deduper runs f at most once per key (I3): claim the key, run f, mark the
// key done for ttl; when f fails the key is released so that a later retry
// (from the DLQ) can run it. A key already done returns duplicate=true
// without calling f. A key claimed by someone else is waited on, never
// treated as done. Errors other than f's own mean the dedup store failed.
type Deduper interface {
	Do(ctx context.Context, key string, ttl time.Duration, f func(context.Context) error) (duplicate bool, err error)
}

// Ticket is a dedup key claimed ahead by an AheadDeduper; opaque to the
// consumer.
type Ticket any

// AheadDeduper is a Deduper that can claim the keys of a user's queued
// messages together before their turn, and confirm a key done without
// holding up the user's next message. The actor claims its mailbox's next
// keys in one round trip and, per message, waits for nothing in Redis in the
// common case (the claim is already held, the done mark is sent on). The
// protocol per key is Deduper's: only the claims are taken earlier.
type AheadDeduper interface {
	Deduper
	// ClaimAhead claims keys for the DoTicket calls that follow, in order.
	ClaimAhead(ctx context.Context, keys []string) []Ticket
	// DoTicket is Do for a key claimed by ClaimAhead. When f succeeded
	// (duplicate false, err nil) the done mark may still be on its way:
	// marked is then called once, from any goroutine, with nil when the
	// key is durably done, or an error when the mark was given up (the
	// consumer is stopping). f gets ctx as it is: when the key's claim is
	// lost while f runs (it expired, or another owner took the key), lost
	// is called, at most once and from any goroutine, before DoTicket
	// returns, and the caller makes f return. It may be called again for
	// the same ticket after an error that is not f's.
	DoTicket(ctx context.Context, t Ticket, ttl time.Duration, f func(context.Context) error, marked, lost func(error)) (duplicate bool, err error)
	// Release gives back the claims of tickets that will not be run.
	Release(ts []Ticket)
}

// UserDeduper is an AheadDeduper that keeps its state per user — a lease
// on the user and the user's done marks — instead of per message: it is
// asked for one user's queued messages together. The consumer uses it for
// every message (never Do), and gives back the users it has no work for
// after a rebalance, so their new owner does not wait for a lease.
type UserDeduper interface {
	AheadDeduper
	// ClaimUser takes (or keeps) user's lease and looks items up in the
	// user's done marks; the tickets run in order with DoTicket.
	ClaimUser(ctx context.Context, user string, items []DedupItem) []Ticket
	// ReleaseIdle gives back the leases of users with no work in flight.
	ReleaseIdle()
}

// DedupItem is one message for UserDeduper.ClaimUser.
type DedupItem struct {
	Key      string // the idempotency key (open_kfid:msgid)
	SendTime int64  // WeChat's send_time (Unix seconds), the same in a re-pulled copy
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

// DeadLetter is what the consumer hands to the DLQ.
type DeadLetter struct {
	Reason  string
	Details string
	// Recoverable is false for reasons a retry cannot fix (invalid_message,
	// permanent handler errors).
	Recoverable bool
	// Msg is the decoded record, nil when it could not be decoded.
	Msg *chatmsg.ChatMessage
	// Raw, Key and Headers are the Kafka record as read.
	Raw       []byte
	Key       []byte
	Headers   []kafka.Header
	Topic     string
	Partition int32
	Offset    int64
	// Timestamp is the Kafka record's timestamp.
	Timestamp time.Time
	// UserID is the user the record was routed by: its Kafka key, or the
	// decoded external_userid when the record has no key. When both exist
	// and differ, Details says so.
	UserID string
	// Attempts is how many times the handler ran (0 when it never ran).
	Attempts int
	// FailedAt is when the consumer gave up on the message.
	FailedAt time.Time
}

// DeadLetters sends dead letters asynchronously. done(nil) means the dead
// letter is durable (acknowledged by Kafka or fsync'd to the emergency
// file); only then does the consumer count the message finished and let
// its offset be committed. done(err) means it is not durable; the consumer
// sends it again after a backoff. Send may block while the sender's own
// queue is full, but must return: the consumer calls it only from the
// letter's partition's dead-letter goroutine, which Close waits for.
type DeadLetters interface {
	Send(dl *DeadLetter, done func(error))
}

// Clock is the time source; tests may inject their own.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable, resettable timer from Clock.AfterFunc.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

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
