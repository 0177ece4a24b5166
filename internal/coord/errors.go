package coord

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by every operation that starts after
	// Provider.Close.
	ErrClosed = errors.New("coord: provider closed")

	// ErrNotFound is returned by Get and GetWithVersion when the key does
	// not exist.
	ErrNotFound = errors.New("coord: key not found")

	// ErrDecode wraps a value that is not valid JSON for the requested type:
	// returned by Get and GetWithVersion, and set as Err on watch events and
	// list entries (which are still delivered, with a zero Value).
	ErrDecode = errors.New("coord: cannot decode value")

	// ErrVersionConflict is matched (errors.Is) by the *VersionConflictError
	// that CompareAndSet returns when the key's version is not the expected
	// one.
	ErrVersionConflict = errors.New("coord: version conflict")

	// ErrNotRegistered is returned by Registry.Unregister for a service ID
	// this Provider has not registered.
	ErrNotRegistered = errors.New("coord: service not registered")

	// ErrLocked is returned by Lock.TryAcquire when another holder has the
	// lock.
	ErrLocked = errors.New("coord: locked by another holder")

	// ErrNotHeld is returned by Lock.Unlock, Lock.Remaining and
	// Lock.GuardedPut when the Lock does not hold the lock (never acquired,
	// unlocked, or its lease was lost).
	ErrNotHeld = errors.New("coord: lock not held")

	// ErrFenced is returned by Lock.GuardedPut when the fencing token is no
	// longer the lock's: the write was not made.
	ErrFenced = errors.New("coord: fenced out: lock lost")

	// ErrNoFreeID is returned by InstanceIDAllocator.AcquireID when every ID
	// in [1, maxID] is held.
	ErrNoFreeID = errors.New("coord: no free instance id")

	// ErrIDLost is AllocatedID.Err after the ID's lease expired: another
	// instance may hold the ID now.
	ErrIDLost = errors.New("coord: instance id lost with its lease")

	// ErrIDTaken is AllocatedID.Err after the ID's key was deleted or
	// rewritten by someone else while it was held.
	ErrIDTaken = errors.New("coord: instance id key deleted or rewritten by someone else")
)

// VersionConflictError is returned by CompareAndSet when the key's version
// differs from the expected one. errors.Is(err, ErrVersionConflict) is true.
type VersionConflictError struct {
	Key      string
	Expected int64
	// Current is the key's version now; 0 when the key does not exist.
	Current int64
}

func (e *VersionConflictError) Error() string {
	return fmt.Sprintf("coord: version conflict on %q: expected %d, current %d", e.Key, e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrVersionConflict) true.
func (e *VersionConflictError) Is(target error) bool { return target == ErrVersionConflict }
