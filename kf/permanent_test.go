package kf_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// TestPermanentIsOneConcept: a WeChat errcode that retrying cannot fix is
// permanent to kf.IsPermanent and to kfpipe.IsPermanent alike, bare or
// wrapped, and a retryable one to neither; kfpipe.Permanent marks any
// error the same way.
func TestPermanentIsOneConcept(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"reply window closed", &kf.Error{API: "send_msg", Code: kf.CodeReplyWindowClosed}, true},
		{"session ended, wrapped", fmt.Errorf("reply: %w", &kf.Error{API: "send_msg", Code: kf.CodeSessionEnded}), true},
		{"invalid media", &kf.Error{API: "send_msg", Code: kf.CodeInvalidMediaID}, true},
		{"system busy", &kf.Error{API: "send_msg", Code: kf.CodeSystemBusy}, false},
		{"frequency limit, wrapped", fmt.Errorf("reply: %w", &kf.Error{API: "send_msg", Code: kf.CodeFrequencyLimit}), false},
		{"called too often", &kf.Error{API: "send_msg", Code: 45011}, false},
		{"too many concurrent calls", &kf.Error{API: "send_msg", Code: 45033}, false},
		{"marked by the handler", kfpipe.Permanent(errors.New("unsupported")), true},
		{"plain", errors.New("network down"), false},
		{"a context's end", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		if got := kf.IsPermanent(tt.err); got != tt.want {
			t.Errorf("%s: kf.IsPermanent = %v, want %v", tt.name, got, tt.want)
		}
		if got := kfpipe.IsPermanent(tt.err); got != tt.want {
			t.Errorf("%s: kfpipe.IsPermanent = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestClientRefusalIsPermanentToTheHandlerPath: the error the client
// returns for a refused send (95001, the 5-replies limit) is permanent to
// kfpipe without wrapping, so a handler that returns it as is dead-letters
// its message at once instead of retrying it against the same limit.
func TestClientRefusalIsPermanentToTheHandlerPath(t *testing.T) {
	ctx := context.Background()
	fake, c, _ := setup(t)
	fake.AddText("wk1", "u1", "hi")
	var err error
	for range kf.MaxRepliesPerMessage + 1 {
		if _, err = c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "x"}); err != nil {
			break
		}
	}
	var ke *kf.Error
	if !errors.As(err, &ke) || ke.Code != kf.CodeReplyLimit {
		t.Fatalf("send past the limit: %v, want errcode %d", err, kf.CodeReplyLimit)
	}
	if !kfpipe.IsPermanent(err) || !kfpipe.IsPermanent(fmt.Errorf("handler: %w", err)) {
		t.Fatalf("kfpipe.IsPermanent(%v) = false", err)
	}
}
