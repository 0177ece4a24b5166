package idgen

import "errors"

var (
	// ErrClockBackwards is returned by Generator.Next when the clock moved
	// back by more than a second: waiting would stall callers for too long
	// and reusing older timestamps could repeat IDs.
	ErrClockBackwards = errors.New("idgen: clock moved backwards")

	// ErrClockOutOfRange is returned by Generator.Next when the time since
	// the epoch no longer fits in 41 bits (about 69 years), and by New when
	// the epoch is in the future or too far in the past.
	ErrClockOutOfRange = errors.New("idgen: clock outside the 41-bit range of the epoch")

	// ErrNoFreeID is returned by Allocate when every worker ID in the pool is
	// held by someone else.
	ErrNoFreeID = errors.New("idgen: no free worker id")

	// ErrNotAllocated is returned (or sent on the KeepAlive channel) when a
	// worker ID is needed but Allocate has not succeeded.
	ErrNotAllocated = errors.New("idgen: no worker id allocated")

	// ErrStopped is returned by Allocate and KeepAlive after Stop.
	ErrStopped = errors.New("idgen: allocator stopped")

	// ErrKeyStolen is sent on the KeepAlive channel (and returned by Stop)
	// when the worker-ID key now belongs to another owner: two generators may
	// be sharing the worker ID, so this process must stop issuing IDs.
	ErrKeyStolen = errors.New("idgen: worker id taken over by another owner")

	// ErrLeaseExpired is sent on the KeepAlive channel when the worker-ID key
	// or lease expired before it could be renewed.
	ErrLeaseExpired = errors.New("idgen: worker id lease expired")
)
