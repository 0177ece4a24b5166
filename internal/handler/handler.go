// Package handler is the contract between the consumer and the code it
// runs for each message: the Handler, what its context carries (the
// delivery, the batch, the partition lease's fencing token and reply log,
// the owner's deadline) and the "retrying cannot fix it" marker. It is a
// leaf: the reply and media wrappers and the public kfpipe package build
// on it without importing the consumer engine.
package handler

import (
	"context"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/permanent"
)

// Handler is the business logic plugged into the consumer. Handle is called
// from the user's actor, one message at a time per user, in partition order
// (I4). A nil error finishes the message. An error is retried in place
// (processor.retry_attempts, exponential backoff) unless it is Permanent;
// after the last attempt the message goes to the DLQ. ctx ends at
// processor.attempt_timeout or when the consumer stops. Handle must be
// idempotent for a message whose previous attempt timed out, because the
// handler may have had an effect before the timeout fired.
type Handler interface {
	Handle(ctx context.Context, m *chatmsg.ChatMessage) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m *chatmsg.ChatMessage) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *chatmsg.ChatMessage) error { return f(ctx, m) }

// Permanent marks err as not retryable: the message goes straight to the
// DLQ as handler_rejected (the handler refused it for good; an operator may
// retry it once the handler is fixed), not recoverable. Permanent(nil) is nil. It is
// permanent.Mark; a WeChat errcode that retrying cannot fix (kf.Error,
// wecom.APIError) is permanent without it.
func Permanent(err error) error { return permanent.Mark(err) }

// IsPermanent reports whether err (or an error it wraps) is permanent:
// made by Permanent, or a WeChat errcode that retrying cannot fix
// (permanent.Is).
func IsPermanent(err error) bool { return permanent.Is(err) }

// RetryAfterError is a retryable failure after which the receiver asked
// for a pause (HTTP Retry-After): the next attempt waits at least After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }
