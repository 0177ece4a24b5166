package kfpipetest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// imageEcho answers a customer's picture with the same picture: the
// picture is uploaded (WeChat gives each upload a new media_id) and the
// reply is an image with the upload's media_id. With memo, the upload's
// media_id is kept with the message (kfpipe.Memo); without, every run
// uploads again.
func imageEcho(memo bool, uploads *int) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() || m.MsgType != kfpipe.MsgImage {
			return nil
		}
		upload := func(ctx context.Context) (string, error) {
			obj, err := kfpipe.OpenMedia(ctx, m)
			if err != nil {
				return "", err
			}
			defer obj.Close()
			data, err := io.ReadAll(obj)
			if err != nil {
				return "", err
			}
			kc, err := kfpipe.Client(ctx)
			if err != nil {
				return "", err
			}
			*uploads++
			return kc.UploadMedia(ctx, kf.MediaImage, obj.FileName, data)
		}
		var id string
		var err error
		if memo {
			id, err = kfpipe.Memo(ctx, "echo-upload", upload)
		} else {
			id, err = upload(ctx)
		}
		if err != nil {
			return err
		}
		return kfpipe.Reply(ctx, kf.Image{MediaID: id})
	})
}

// jpeg is the start of a JPEG file: enough for the fake WeChat.
var jpeg = []byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00 a customer's photo")

// recordT is a TB that records the harness's reports instead of failing.
type recordT struct {
	*testing.T
	errors []string
}

func (r *recordT) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// Fatalf records and stops the caller, as t.Fatalf would (a panic the
// test recovers).
func (r *recordT) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(r)
}

// TestMemoMakesAnImageEchoExactlyOnce: with kfpipe.Memo the image-echo bot
// uploads once and a second run (as after a crash) replies with the same
// media_id; without it, RunTwice reports the second run's different image.
func TestMemoMakesAnImageEchoExactlyOnce(t *testing.T) {
	uploads := 0
	h := kfpipetest.New(t, imageEcho(true, &uploads))
	first, second := h.RunTwice(h.ImageWith("u1", jpeg))
	first.ExpectDone()
	second.ExpectDone()
	if uploads != 1 {
		t.Fatalf("with Memo the picture was uploaded %d times over two runs, want 1", uploads)
	}
	if got := second.Replies; len(got) != 1 || got[0].Outcome != kfpipetest.Skipped || got[0].Message != first.Replies[0].Message {
		t.Fatalf("second run: %v, want the first run's image, skipped (first: %v)", got, first.Replies)
	}
	if d := h.Delivered("u1"); len(d) != 1 || d[0] != "<image>" {
		t.Fatalf("the customer got %q, want one image", d)
	}

	// Without a memo the second run uploads again and replies differently.
	rt := &recordT{T: t}
	uploads = 0
	h2 := kfpipetest.New(rt, imageEcho(false, &uploads))
	h2.RunTwice(h2.ImageWith("u1", jpeg))
	if uploads != 2 || len(rt.errors) != 1 || !strings.Contains(rt.errors[0], "replied differently") {
		t.Fatalf("without Memo: %d uploads, reports %q; want 2 uploads and RunTwice's report", uploads, rt.errors)
	}
}

// TestMemoKeepsNothingOnError: a failed side step is computed again on
// the next attempt; the value the successful one computed is kept.
func TestMemoKeepsNothingOnError(t *testing.T) {
	calls := 0
	h := kfpipetest.New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		n, err := kfpipe.Memo(ctx, "ticket", func(ctx context.Context) (int, error) {
			calls++
			if calls == 1 {
				return 0, errors.New("the ticket system is down")
			}
			return 1000 + calls, nil
		})
		if err != nil {
			return err
		}
		return kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("ticket %d", n)})
	}))
	m := kfpipetest.Text("u1", "my parcel is broken")
	h.Run(m).ExpectRetried().ExpectTexts("ticket 1002")
	h.Run(m).ExpectDone().ExpectTexts("ticket 1002")
	if calls != 2 {
		t.Fatalf("the side step ran %d times, want 2 (one failure, one success, none on the re-run)", calls)
	}
	if _, err := kfpipe.Memo(context.Background(), "x", func(context.Context) (string, error) { return "", nil }); !errors.Is(err, kfpipe.ErrNoReplier) {
		t.Fatalf("Memo outside a handler: %v, want ErrNoReplier", err)
	}
}

// TestFailNext injects WeChat's answers: 95018 on send_msg is a skipped
// reply that finishes the message; 40014 is absorbed by the client's token
// refetch; 45009 past the client's own retries fails the attempt and the
// message is retried; a failing media download or upload fails the
// attempt the same way.
func TestFailNext(t *testing.T) {
	echo := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if text, ok := m.Text(); ok {
			return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
		}
		return nil
	})
	h := kfpipetest.New(t, echo)
	h.FailNext(kfpipetest.APISendMsg, 1, kfpipetest.ErrcodeServicerSession)
	r := h.Run(kfpipetest.Text("u1", "hello")).ExpectDone()
	if len(r.Replies) != 1 || r.Replies[0].Outcome != kfpipetest.ServicerSession || !errors.Is(r.Replies[0].Err, kfpipe.ErrServicerSession) {
		t.Fatalf("95018: replies %v, want one with outcome servicer_session", r.Replies)
	}
	if d := h.Delivered("u1"); len(d) != 0 {
		t.Fatalf("95018: the customer got %q", d)
	}

	h.FailNext(kfpipetest.APIAny, 1, kfpipetest.ErrcodeInvalidToken)
	h.Run(kfpipetest.Text("u1", "token")).ExpectDone().ExpectTexts("You said: token")

	h.FailNext(kfpipetest.APISendMsg, 4, kfpipetest.ErrcodeFrequencyLimit)
	r = h.Run(kfpipetest.Text("u1", "busy")).ExpectRetried().ExpectTexts("You said: busy")
	if r.Replies[0].Outcome != kfpipetest.Failed {
		t.Fatalf("45009 four times: replies %v; want the first attempt's failed and retried", r.Replies)
	}

	uploads := 0
	h2 := kfpipetest.New(t, imageEcho(true, &uploads), kfpipetest.Attempts(5))
	h2.FailNext(kfpipetest.APIMediaGet, 4, kfpipetest.ErrcodeFrequencyLimit)
	h2.FailNext(kfpipetest.APIMediaUpload, 4, kfpipetest.ErrcodeFrequencyLimit)
	r = h2.Run(h2.ImageWith("u1", jpeg)).ExpectDone()
	t.Logf("media/get and media/upload failing 4 times each: %d attempts, %d uploads", r.Attempts, uploads)
	if r.Attempts < 2 || len(r.LastCall()) != 1 || r.LastCall()[0].Outcome != kfpipetest.Sent {
		t.Fatalf("failing downloads and uploads: %d attempts, replies %v; want an attempt failed, a later one to send the image", r.Attempts, r.Replies)
	}
	// A refusal of the upload that retrying cannot fix dead-letters the
	// message at once.
	h2.FailNext(kfpipetest.APIMediaUpload, 1, 40006)
	h2.Run(h2.ImageWith("u1", jpeg)).ExpectPermanent().ExpectNoReplies()
}

// TestExpectNoReplies: a transfer alone is a reply ExpectTexts does not
// see; ExpectNoReplies does.
func TestExpectNoReplies(t *testing.T) {
	rt := &recordT{T: t}
	h := kfpipetest.New(rt, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		_, err := kfpipe.Transfer(ctx, kf.StateEnded, "")
		return err
	}))
	r := h.Run(kfpipetest.ServicerText("u1", "alice", "bye")).ExpectDone().ExpectTexts()
	defer func() {
		if p := recover(); p != rt || len(rt.errors) != 1 || !strings.Contains(rt.errors[0], "transfer to state 4") {
			t.Fatalf("ExpectNoReplies of a handler that ended the session: %v, reports %q; want the transfer reported", p, rt.errors)
		}
	}()
	r.ExpectNoReplies()
}
