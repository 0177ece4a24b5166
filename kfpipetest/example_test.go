package kfpipetest_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// printT stands in for the *testing.T of a test: it prints what the
// harness reports, so the examples can show it (with msgids, which depend
// on how many messages were built before, as "kfpipetest-msg-N").
type printT struct{ cleanups []func() }

var msgIDs = regexp.MustCompile(`kfpipetest-msg-[0-9]+`)

func (*printT) Helper() {}
func (*printT) Errorf(format string, args ...any) {
	fmt.Println("ERROR " + msgIDs.ReplaceAllString(fmt.Sprintf(format, args...), "kfpipetest-msg-N"))
}
func (*printT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (p *printT) Cleanup(f func())                { p.cleanups = append(p.cleanups, f) }
func (p *printT) done() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
}

// echo answers a customer's text and ignores everything else.
var echo = kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
	if !m.FromCustomer() {
		return nil
	}
	if text, ok := m.Text(); ok {
		return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
	}
	return nil
})

// A handler runs with kfpipe's real reply path; Result shows its replies,
// Delivered what reached the customer. In a test, pass t to New.
func Example() {
	t := &printT{}
	defer t.done()
	h := kfpipetest.New(t, echo)

	r := h.Run(kfpipetest.Text("u1", "hello")).ExpectDone()
	fmt.Println(r.Texts(), r.Replies[0].Outcome)
	h.Run(kfpipetest.ServicerText("u1", "alice", "Hi, I am Alice from support")).ExpectDone().ExpectTexts()
	fmt.Println(h.Delivered("u1"))
	// Output:
	// [You said: hello] sent
	// [You said: hello]
}

// RunTwice reports a handler whose replies change when it runs again for
// the same message: the customer would never see the second run's reply.
func ExampleHarness_RunTwice() {
	t := &printT{}
	defer t.done()
	var calls atomic.Int32
	counting := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("you are visitor %d", calls.Add(1))})
	})
	h := kfpipetest.New(t, counting)
	m := kfpipetest.Text("u1", "hi")
	_, second := h.RunTwice(m)
	fmt.Println(second.Replies[0].Outcome, h.Delivered("u1"), h.Mismatches())
	// Output:
	// ERROR kfpipetest: the handler replied differently when it ran again for message kfpipetest-msg-N (text from u1): reply 0 was reply kf.Text{Content:"you are visitor 1"} on the first run and reply kf.Text{Content:"you are visitor 2"} on the second: the second is skipped, the customer only ever sees the first
	// skipped [you are visitor 1] 1
}

// Errors: a retry finishes a message, Permanent dead-letters it at once,
// a handler that keeps failing has it dead-lettered after its attempts.
func ExampleResult_ExpectRetried() {
	t := &printT{}
	defer t.done()
	var calls atomic.Int32
	flaky := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if text, _ := m.Text(); text == "bad" {
			return kfpipe.Permanent(errors.New("cannot read it"))
		}
		if text, _ := m.Text(); text == "down" {
			return errors.New("backend down")
		}
		if err := kfpipe.Reply(ctx, kf.Text{Content: "one moment"}); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("timeout talking to the backend")
		}
		return kfpipe.Reply(ctx, kf.Text{Content: "done"})
	})
	h := kfpipetest.New(t, flaky)
	r := h.Run(kfpipetest.Text("u1", "order")).ExpectRetried()
	fmt.Println(r.Attempts, h.Delivered("u1"))
	r = h.Run(kfpipetest.Text("u2", "bad")).ExpectPermanent()
	fmt.Println(r.Reason)
	r = h.Run(kfpipetest.Text("u3", "down")).ExpectDeadLettered(kfpipetest.ReasonDownstreamError)
	fmt.Println(r.Attempts)
	// Output:
	// 2 [one moment done]
	// handler_rejected
	// 3
}

// A welcome message answers an enter_session event (once, within 20 s);
// Transfer hands the customer to a servicer.
func ExampleEnterSession() {
	t := &printT{}
	defer t.done()
	bot := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if ev, ok := m.Event(); ok && ev.Type == kfpipe.EventEnterSession {
			return kfpipe.Welcome(ctx, kf.Text{Content: "Welcome! (" + ev.Scene + ")"})
		}
		if id := m.MenuID(); id == "human" && m.FromCustomer() {
			_, err := kfpipe.Transfer(ctx, kf.StateServicer, "alice")
			return err
		}
		return nil
	})
	h := kfpipetest.New(t, bot)
	h.RunTwice(kfpipetest.EnterSession("u1", "ad-1", ""))
	r := h.Run(kfpipetest.MenuClick("u1", "human", "Talk to a person")).ExpectDone()
	fmt.Println(h.Delivered("u1"), r.Replies[0], h.SessionState("u1") == kf.StateServicer)
	// Output: [Welcome! (ad-1)] transfer to state 3 (alice) true
}

// A handler reads a customer's image with kfpipe.OpenMedia: ImageWith
// gives the fake WeChat the image's bytes, and Run keeps them in the test's
// media store before the handler runs, as the consumer does — so a Run
// after WeChat expired the media_id still has them.
func ExampleHarness_ImageWith() {
	t := &printT{}
	defer t.done()
	photo := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if _, ok := m.Media(); !ok {
			return nil
		}
		obj, err := kfpipe.OpenMedia(ctx, m)
		if err != nil {
			return err
		}
		defer obj.Close()
		return kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("Got your %s of %d bytes", obj.ContentType, obj.Size)})
	})
	h := kfpipetest.New(t, photo)

	png := []byte("\x89PNG\r\n\x1a\n" + strings.Repeat("\x00", 92)) // 100 bytes
	m := h.ImageWith("u1", png)
	fmt.Println(h.Run(m).ExpectDone().Texts())
	h.ExpireMedia(m) // day 4: WeChat no longer has it; the store has
	fmt.Println(h.Run(m).ExpectDone().Texts())
	fmt.Println(h.Run(h.FileWith("u2", "notes.txt", []byte("hello"))).ExpectDone().Texts())
	// Output:
	// [Got your image/png of 100 bytes]
	// [Got your image/png of 100 bytes]
	// [Got your text/plain; charset=utf-8 of 5 bytes]
}
