package producer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe/internal/permanent"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// TestPermanentCodeIsTheSharedCheck: the sync loop calls permanent exactly
// the errors kf.IsPermanent (kfpipe.IsPermanent) does — a WeChat errcode
// that retrying cannot fix, however it reaches the loop — and keeps
// retrying the retryable ones and errors without an errcode.
func TestPermanentCodeIsTheSharedCheck(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode int
		want     bool
	}{
		{"wecom client, invalid open_kfid", fmt.Errorf("sync_msg: %w", &wecom.APIError{Code: wecom.CodeInvalidOpenKfID}), 95000, true},
		{"wecom client, bad secret", &wecom.APIError{Code: wecom.CodeInvalidCredential}, 40001, true},
		{"wecom client, invalid parameter", &wecom.APIError{Code: wecom.CodeInvalidParameter}, 40058, true},
		{"wecom client, busy", &wecom.APIError{Code: wecom.CodeSystemBusy}, -1, false},
		{"wecom client, rate limited", fmt.Errorf("%w: %w", ErrRateLimited, &wecom.APIError{Code: wecom.CodeRateLimited}), 45009, false},
		{"an errcode carrier", codeErr(48002), 48002, true},
		{"an errcode carrier, rate limited", codeErr(45009), 45009, false},
		{"an errcode carrier, called too often", codeErr(45011), 45011, false},
		{"an errcode carrier, too many concurrent calls", codeErr(45033), 45033, false},
		{"no errcode", errors.New("connection reset"), 0, false},
		{"marked", permanent.Mark(errors.New("unusable source")), 0, true},
	}
	for _, tt := range tests {
		code, got := permanentCode(tt.err)
		if code != tt.wantCode || got != tt.want {
			t.Errorf("%s: permanentCode = %d %v, want %d %v", tt.name, code, got, tt.wantCode, tt.want)
		}
		var ae *wecom.APIError
		if errors.As(tt.err, &ae) {
			// The same errcode as the kf client reports it to a handler.
			ke := &kf.Error{API: "send_msg", Code: ae.Code}
			if kf.IsPermanent(ke) != got || kf.IsPermanent(tt.err) != got {
				t.Errorf("%s: the sync loop says permanent %v, kf.IsPermanent %v (kf.Error) %v (as returned)",
					tt.name, got, kf.IsPermanent(ke), kf.IsPermanent(tt.err))
			}
		}
	}
	if !permanent.Is(fmt.Errorf("%w: %w", ErrPermanent, errors.New("x"))) {
		t.Error("ErrPermanent is not permanent")
	}
}
