// Package permanent is kfpipe's one notion of an error that retrying
// cannot fix, shared by the handler path (kfpipe.Permanent), the WeChat
// clients (an errcode that will not change on retry) and the producer's
// sync loop. An error is permanent when it, or an error it wraps, has a
// method Permanent() bool that returns true: Mark adds one to any error,
// and WeChat's error types have one that classifies their errcode
// (wecom.PermanentCode). Each caller then decides what permanent means for
// it: the consumer dead-letters the message at once, the sync loop backs
// off for minutes instead of retrying in a loop.
package permanent

// Error is implemented by errors that know whether retrying can fix them.
type Error interface {
	error
	Permanent() bool
}

type marked struct{ err error }

func (e *marked) Error() string   { return "permanent: " + e.err.Error() }
func (e *marked) Unwrap() error   { return e.err }
func (e *marked) Permanent() bool { return true }

// Mark marks err as permanent. Mark(nil) is nil.
func Mark(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err}
}

// Is reports whether err, or any error it wraps (errors.Join and
// multi-%w included), is permanent.
func Is(err error) bool {
	for err != nil {
		if p, ok := err.(Error); ok && p.Permanent() {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if Is(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

var _ Error = (*marked)(nil)
