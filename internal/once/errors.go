package once

import "errors"

// Errors returned by this package.
var (
	// ErrClosed is returned by Do, Execute and their Status variants after
	// Close, when the call could not be handed to Redis any more.
	ErrClosed = errors.New("once: client closed")

	// ErrInvalidTTL is returned by Do and Execute when ttl is shorter than
	// one millisecond: a done marker must expire at some point and Redis
	// counts in milliseconds.
	ErrInvalidTTL = errors.New("once: ttl must be at least 1ms")

	// ErrLeaseLost is the cause of the context given to f when the
	// processing claim could not be extended because it is no longer ours
	// (it expired and someone else may be running the same key). f should
	// stop its work.
	ErrLeaseLost = errors.New("once: processing lease lost")

	// ErrUnexpectedValue is returned when the key holds a value this
	// package did not write (someone else uses the same key space).
	ErrUnexpectedValue = errors.New("once: key holds a value not written by once")
)
