package producer

import "errors"

// Errors of this package.
var (
	// ErrDelivery wraps a failed delivery report; ProduceBatch returns it
	// and the sync loop then keeps the cursor where it was (I1).
	ErrDelivery = errors.New("kafka delivery failed")
	// ErrClosed is returned by KafkaProducer methods after Close.
	ErrClosed = errors.New("producer closed")

	// ErrLockBusy is what a Locker returns when another holder has the lock.
	ErrLockBusy = errors.New("sync lock busy")
	// ErrNotHeld is what Mutex.SetIfHeld returns when the lock is no longer
	// ours: a newer holder owns the cursor.
	ErrNotHeld = errors.New("sync lock not held")
	// ErrTokenInvalid is what a Source returns for WeChat errcode 95007 (the
	// callback token is invalid or expired); the sync retries without it.
	ErrTokenInvalid = errors.New("sync_msg: callback token invalid")
	// ErrRateLimited is what a Source returns for WeChat errcode 45009; the
	// sync backs off.
	ErrRateLimited = errors.New("sync_msg: rate limited")

	// ErrOverloaded is returned by Syncer.Trigger when the set of distinct
	// pending open_kfids is full; the callback handler should then not
	// answer "success" so that WeChat retries the callback.
	ErrOverloaded = errors.New("sync trigger queue full")
	// ErrStopped is returned by Syncer.Trigger after Stop.
	ErrStopped = errors.New("syncer stopped")
	// ErrPaused is returned by Syncer.Healthy while syncing is paused.
	ErrPaused = errors.New("syncing paused")
)

// WeChat errcodes the sync loop reacts to. A Source may return an error
// carrying one of them (a method ErrCode() int or Code() int) instead of the
// sentinels above.
const (
	codeTokenInvalid = 95007
	codeRateLimited  = 45009
)

type errCoder interface{ ErrCode() int }
type coder interface{ Code() int }

func wecomCode(err error) int {
	var ec errCoder
	if errors.As(err, &ec) {
		return ec.ErrCode()
	}
	var c coder
	if errors.As(err, &c) {
		return c.Code()
	}
	return 0
}

func isTokenInvalid(err error) bool {
	return errors.Is(err, ErrTokenInvalid) || wecomCode(err) == codeTokenInvalid
}

func isRateLimited(err error) bool {
	return errors.Is(err, ErrRateLimited) || wecomCode(err) == codeRateLimited
}
