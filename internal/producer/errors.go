package producer

import (
	"errors"

	"github.com/kfpipe/kfpipe/internal/permanent"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

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
	// ErrUnknownOpenKfID is returned by Syncer.Trigger for an open_kfid
	// that wecom.open_kfids does not list: the callback is answered (WeChat
	// must not resend it) and ignored.
	ErrUnknownOpenKfID = errors.New("sync trigger: open_kfid not in wecom.open_kfids")
	// ErrPermanent marks a sync_msg error that retrying soon cannot fix
	// (see permanentCode); the open_kfid is retried after a capped backoff
	// of minutes instead of in a tight loop. It is itself permanent
	// (permanent.Is).
	ErrPermanent = permanent.Mark(errors.New("sync_msg: permanent error"))
)

// permanentCodes say what the permanent errcodes an operator most often
// meets on sync_msg mean: the account or the credentials are wrong, or the
// app may not call the API. An operator must act; until then the open_kfid
// is retried every few minutes (permanentBackoff), not in a loop. Which
// errcodes are permanent is wecom.PermanentCode's call, not this list's.
var permanentCodes = map[int]string{
	40001: "invalid credential (wecom.secret)",
	40013: "invalid corp id (wecom.corp_id)",
	48002: "API forbidden: the app lacks the customer-service permission",
	60020: "caller IP not in the app's trusted IP list",
	95000: "invalid open_kfid: not a customer-service account of this corp",
}

// permanentCode returns err's errcode (0 when it carries none) and whether
// err is permanent: marked so (permanent.Is: a wecom.APIError, kf.Error) or
// carrying an errcode wecom.PermanentCode calls permanent — the one check
// the handler path and kf.IsPermanent make too.
func permanentCode(err error) (int, bool) {
	c := wecomCode(err)
	return c, permanent.Is(err) || wecom.PermanentCode(c)
}

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
