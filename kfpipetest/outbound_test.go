package kfpipetest

import (
	"context"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// TestLongTextSplitExactlyOnce: a text over WeChat's 2,048 bytes goes out
// as numbered parts, each a reply of its own, each delivered once however
// often the handler runs; one that would need more messages than the
// customer's message allows is refused as Permanent, nothing sent.
func TestLongTextSplitExactlyOnce(t *testing.T) {
	long := strings.Repeat("售后政策说明 policy ", 300) // 300 × 26 bytes
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		text, _ := m.Text()
		switch text {
		case "policy":
			return kfpipe.Reply(ctx, kf.Text{Content: long})
		case "too long":
			if err := kfpipe.Reply(ctx, kf.Text{Content: "first"}); err != nil {
				return err
			}
			return kfpipe.Reply(ctx, kf.Text{Content: strings.Repeat("x", 4*kf.MaxTextBytes+1)})
		}
		return nil
	}))
	first, second := h.RunTwice(Text("u1", "policy"))
	first.ExpectDone()
	second.ExpectDone()
	got := h.Delivered("u1")
	if len(got) != 4 || !strings.HasPrefix(got[0], "(1/4) ") || !strings.HasPrefix(got[3], "(4/4) ") {
		t.Fatalf("delivered %d parts: %.20q…", len(got), got)
	}
	var joined strings.Builder
	for i, p := range got {
		if len(p) > kf.MaxTextBytes {
			t.Fatalf("part %d: %d bytes", i, len(p))
		}
		joined.WriteString(p[len("(1/4) "):])
	}
	if joined.String() != long {
		t.Fatal("the delivered parts are not the text")
	}
	for _, r := range second.LastCall() {
		if r.Outcome != Skipped {
			t.Fatalf("second run: %v, want every part skipped", second.LastCall())
		}
	}
	// 1 reply made + 5 parts needed > 5: refused before any part.
	h.Run(Text("u2", "too long")).ExpectPermanent()
	if got := h.Delivered("u2"); len(got) != 1 || got[0] != "first" {
		t.Fatalf("delivered %q, want only the first reply", got)
	}
}
