package handler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Delivery is what a record's headers say about this delivery of its
// message: whether the DLQ's recovery put it back on the main topic, and
// how many times that has happened.
type Delivery struct {
	RetryFromDLQ bool
	RetryCount   int
}

type deliveryKey struct{}

// WithDelivery returns ctx carrying d (ctx itself for a first delivery).
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	if d == (Delivery{}) {
		return ctx
	}
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFrom returns the Delivery of the message a handler call handles
// (the zero Delivery for a first delivery).
func DeliveryFrom(ctx context.Context) Delivery {
	d, _ := ctx.Value(deliveryKey{}).(Delivery)
	return d
}

// BatchItem is one message of a batch with its delivery.
type BatchItem struct {
	Msg      *chatmsg.ChatMessage
	Delivery Delivery
}

type batchKey struct{}

// BatchFrom returns the batch the handler call ctx belongs to, in order
// (nil outside batch mode). Its first message is the one Handle got.
func BatchFrom(ctx context.Context) []BatchItem {
	b, _ := ctx.Value(batchKey{}).([]BatchItem)
	return b
}

// WithBatchItems returns ctx carrying items as its batch (for tests and
// harnesses that call a handler in batch mode without a consumer).
func WithBatchItems(ctx context.Context, items []BatchItem) context.Context {
	return context.WithValue(ctx, batchKey{}, items)
}

// StateItem is one message as the state store knows it: its idempotency
// key, WeChat's send_time (Unix seconds, the same in every copy) and the
// external_userid.
type StateItem struct {
	Key      string
	SendTime int64
	User     string
}

// ReplyLog keeps a message's replies (each with a key of its own: the
// message's and the reply's number) so that a handler that runs again for
// the message finds the replies it made. The consumer's is the partition's
// lease; the reply path reads it from the handler's context (ReplyLogOf).
type ReplyLog interface {
	// Replied returns what was recorded for the reply it (found false
	// when nothing); it reads the store, never a copy.
	Replied(ctx context.Context, it StateItem) (record string, found bool, err error)
	// RecordReply records the reply it as sent, with record: a fact,
	// recorded whoever owns the partition now.
	RecordReply(ctx context.Context, it StateItem, record string) error
}

// ReplyClaimer is implemented by a ReplyLog that claims a reply before it
// is sent (the partition lease's: the claim carries its fencing token), so
// that two owners of a message — a newer one and an older one that has not
// stopped yet — never both send it.
type ReplyClaimer interface {
	// ClaimReply returns the reply's record (found) when it was recorded;
	// otherwise it claims the reply for hold (what the send may take at
	// most) and returns wait 0, or, when an older owner's claim is live,
	// how long it is live (look again then). A newer owner's claim is an
	// error: the reply is not this owner's to send.
	ClaimReply(ctx context.Context, it StateItem, hold time.Duration) (record string, found bool, wait time.Duration, err error)
}

// Lease is what a handler's context knows of the partition lease it runs
// under: its fencing token and its reply log (the consumer's Lease is
// one).
type Lease interface {
	// Token is the fencing token: larger than every token handed out for
	// the partition before.
	Token() int64
	ReplyLog
}

type leaseKey struct{}

type replyLogKey struct{}

type marginKey struct{}

// WithLease returns ctx whose handler runs under l, which is also its
// reply log, and stops starting work margin before l's local deadline
// (OwnedUntil).
func WithLease(ctx context.Context, l Lease, margin time.Duration) context.Context {
	ctx = WithReplyLog(context.WithValue(ctx, leaseKey{}, l), l)
	return context.WithValue(ctx, marginKey{}, margin)
}

// LeaseOf returns the lease a handler call runs under (ok false outside a
// handler of a consumer with a State).
func LeaseOf(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(Lease)
	return l, ok
}

// WithReplyLog returns ctx whose handler keeps its replies in log: for a
// handler run outside the consumer (the test kit).
func WithReplyLog(ctx context.Context, log ReplyLog) context.Context {
	return context.WithValue(ctx, replyLogKey{}, log)
}

// FencingToken returns the token of the partition lease a handler runs
// under (ok false outside a handler of the consumer).
func FencingToken(ctx context.Context) (token int64, ok bool) {
	l, ok := LeaseOf(ctx)
	if !ok {
		return 0, false
	}
	return l.Token(), true
}

// ReplyLogOf returns the reply log of the partition lease a handler runs
// under (ok false outside a handler of a consumer with a State).
func ReplyLogOf(ctx context.Context) (ReplyLog, bool) {
	l, ok := ctx.Value(replyLogKey{}).(ReplyLog)
	return l, ok
}

// MemReplyLog is a ReplyLog in memory (the test kit's, and a consumer's
// without a State). The zero value is not usable: NewMemReplyLog.
type MemReplyLog struct {
	mu sync.Mutex
	m  map[string]string
}

// NewMemReplyLog returns an empty MemReplyLog.
func NewMemReplyLog() *MemReplyLog { return &MemReplyLog{m: map[string]string{}} }

// Replied implements ReplyLog.
func (l *MemReplyLog) Replied(_ context.Context, it StateItem) (string, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[it.Key]
	return v, ok, nil
}

// RecordReply implements ReplyLog.
func (l *MemReplyLog) RecordReply(_ context.Context, it StateItem, record string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[it.Key] = record
	return nil
}

// ErrNotOwner is returned by CheckOwner (and so by a reply) when the
// partition lease the handler runs under is past its local deadline, or
// was lost: whatever the handler was about to start is the next owner's.
var ErrNotOwner = errors.New("consumer: the partition's lease is no longer certainly held")

// ownedLog is what OwnedUntil reads from the reply log in a handler's
// context (the consumer's is the partition's lease).
type ownedLog interface {
	Lost() <-chan struct{}
	Deadline() time.Time
}

// OwnedUntil returns until when the handler whose context ctx is may start
// something under its partition's lease: the lease's local deadline minus
// the owner margin. ok is false outside a handler of a consumer with a
// State (nothing to check); err is ErrNotOwner when that time has passed
// or the lease was lost. The check is local: no round trip.
func OwnedUntil(ctx context.Context) (until time.Time, ok bool, err error) {
	// The lease a consumer's handler runs under is also its reply log; a
	// handler run outside a consumer (the test kit) may be given a reply
	// log that knows its deadline too.
	d, ok := ctx.Value(replyLogKey{}).(ownedLog)
	if !ok {
		return time.Time{}, false, nil
	}
	select {
	case <-d.Lost():
		return time.Time{}, true, ErrNotOwner
	default:
	}
	margin, _ := ctx.Value(marginKey{}).(time.Duration)
	until = d.Deadline().Add(-margin)
	if !time.Now().Before(until) {
		return until, true, fmt.Errorf("%w (deadline %s)", ErrNotOwner, d.Deadline().Format(time.RFC3339Nano))
	}
	return until, true, nil
}

// CheckOwner returns ErrNotOwner when the handler whose context ctx is may
// no longer start anything under its partition's lease (see OwnedUntil);
// nil otherwise, and outside a consumer's handler.
func CheckOwner(ctx context.Context) error {
	_, _, err := OwnedUntil(ctx)
	return err
}
