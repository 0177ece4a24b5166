package wecom

import (
	"errors"
	"fmt"
)

// WeChat Work error codes the pipeline reacts to.
const (
	CodeSystemBusy         = -1    // transient; retried with backoff
	CodeInvalidCredential  = 40001 // wrong secret
	CodeInvalidCorpID      = 40013
	CodeInvalidAccessToken = 40014 // token unknown: refetch once
	CodeInvalidParameter   = 40058
	CodeMissingAccessToken = 41001
	CodeAccessTokenExpired = 42001 // token expired: refetch once
	CodeRateLimited        = 45009 // API frequency limit reached
	CodeTooFrequent        = 45011 // API called too often: try again shortly
	CodeConcurrencyLimit   = 45033 // too many concurrent calls of the API
	CodeInvalidOpenKfID    = 95000
	CodeInvalidMsgToken    = 95007 // the callback token is expired or unknown
)

// APIError is a non-zero errcode returned by the WeChat Work API. Client
// methods return it (wrapped with context), so test with errors.As or the
// Is… helpers.
type APIError struct {
	Code int
	Msg  string
}

// ErrCode returns the errcode, for callers that classify errors by code
// without importing this package.
func (e *APIError) ErrCode() int { return e.Code }

func (e *APIError) Error() string {
	return fmt.Sprintf("wecom: errcode %d: %s", e.Code, e.Msg)
}

// RetryableCode reports whether a call answered with errcode code may
// succeed when made again soon: -1 (system busy) and WeChat's throttles,
// 45009 (frequency limit), 45011 (called too often) and 45033 (too many
// concurrent calls).
func RetryableCode(code int) bool {
	switch code {
	case CodeSystemBusy, CodeRateLimited, CodeTooFrequent, CodeConcurrencyLimit:
		return true
	}
	return false
}

// ThrottleCode reports whether errcode code is one of WeChat's throttles:
// 45009 (frequency limit), 45011 (called too often), 45033 (too many
// concurrent calls). The callers' overload limiters cut their limit on
// them.
func ThrottleCode(code int) bool {
	switch code {
	case CodeRateLimited, CodeTooFrequent, CodeConcurrencyLimit:
		return true
	}
	return false
}

// PermanentCode reports whether a call answered with errcode code fails
// the same way when made again: every errcode but 0 and the RetryableCode
// ones. It is the one classification of WeChat errcodes: APIError and
// kf.Error are permanent.Error by it, and the producer's sync loop checks
// the errcode a Source returns with it.
func PermanentCode(code int) bool { return code != 0 && !RetryableCode(code) }

// Permanent reports whether retrying cannot fix e (PermanentCode); it
// makes e a permanent.Error, so permanent.Is (kfpipe.IsPermanent) knows it.
func (e *APIError) Permanent() bool { return PermanentCode(e.Code) }

func apiCode(err error) (int, bool) {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code, true
	}
	return 0, false
}

// IsTokenExpired reports whether err is 95007: the callback token passed
// to sync_msg is no longer valid. Sync again without it (or with a newer one).
func IsTokenExpired(err error) bool {
	c, ok := apiCode(err)
	return ok && c == CodeInvalidMsgToken
}

// IsRateLimited reports whether err is 45009, WeChat's frequency limit.
func IsRateLimited(err error) bool {
	c, ok := apiCode(err)
	return ok && c == CodeRateLimited
}

// IsInvalidOpenKfID reports whether err is 95000: the open_kfid is not one
// of this corp's customer-service accounts. Retrying will not help.
func IsInvalidOpenKfID(err error) bool {
	c, ok := apiCode(err)
	return ok && c == CodeInvalidOpenKfID
}

// IsAccessTokenInvalid reports whether err is 40014 or 42001. The client
// already refetched the token once before returning it.
func IsAccessTokenInvalid(err error) bool {
	c, ok := apiCode(err)
	return ok && (c == CodeInvalidAccessToken || c == CodeAccessTokenExpired)
}
