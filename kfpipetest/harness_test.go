package kfpipetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// TestBuilders: each builder's message reads back through kfpipe.Message's
// own accessors with the origin and fields it was built with.
func TestBuilders(t *testing.T) {
	if m := Text("u", "hi"); !m.FromCustomer() || m.MsgType != kfpipe.MsgText || m.ExternalUserID != "u" {
		t.Fatalf("Text: %+v", m)
	} else if c, ok := m.Text(); !ok || c != "hi" || m.MenuID() != "" {
		t.Fatalf("Text reads %q %v, menu %q", c, ok, m.MenuID())
	}
	if m := MenuClick("u", "id-1", "Item"); m.MenuID() != "id-1" {
		t.Fatalf("MenuClick menu id %q", m.MenuID())
	}
	if m := ServicerText("u", "alice", "hello"); !m.FromServicer() || m.FromCustomer() || m.ServicerUserID != "alice" {
		t.Fatalf("ServicerText: %+v", m)
	}
	for _, m := range []*kfpipe.Message{Image("u", "m"), Voice("u", "m"), Video("u", "m"), File("u", "m"),
		Location("u", "n", "a", 1, 2), Link("u", "t", "d", "https://x"), BusinessCard("u", "x"), MiniProgram("u", "a", "t", "p")} {
		if !m.FromCustomer() || m.IsEvent() || !strings.Contains(string(m.Raw), `"`+m.MsgType+`":{`) {
			t.Fatalf("%s: %+v %s", m.MsgType, m, m.Raw)
		}
	}
	if l, ok := Location("u", "Canton Tower", "Guangzhou", 23.1, 113.3).Location(); !ok ||
		l != (kfpipe.Location{Latitude: 23.1, Longitude: 113.3, Name: "Canton Tower", Address: "Guangzhou"}) {
		t.Fatalf("Location reads %+v %v", l, ok)
	}
	ev, ok := EnterSession("u", "s", "p").Event()
	if !ok || ev.Type != kfpipe.EventEnterSession || ev.WelcomeCode == "" || ev.Scene != "s" || ev.SceneParam != "p" {
		t.Fatalf("EnterSession: %+v", ev)
	}
	ev, _ = SessionStatusChange("u", 2, "a", "b").Event()
	if ev.Type != kfpipe.EventSessionStatusChange || ev.ChangeType != 2 || ev.OldServicerUserID != "a" || ev.NewServicerUserID != "b" {
		t.Fatalf("SessionStatusChange: %+v", ev)
	}
	ev, _ = MsgSendFail("u", "x", 4).Event()
	if ev.Type != kfpipe.EventMsgSendFail || ev.FailMsgID != "x" || ev.FailType != 4 {
		t.Fatalf("MsgSendFail: %+v", ev)
	}
	if m := ServicerStatusChange("alice", 1); m.Origin != kfpipe.OriginSystem || m.ExternalUserID != "" {
		t.Fatalf("ServicerStatusChange: %+v", m)
	}
}

// recT records what the harness reports.
type recT struct {
	*testing.T
	errs []string
}

func (r *recT) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestRunTwiceReports: a second run with one reply more or one less is
// reported with the reply's position; the same replies are not.
func TestRunTwiceReports(t *testing.T) {
	for _, c := range []struct {
		name   string
		counts [2]int
		want   string
	}{
		{"same", [2]int{2, 2}, ""},
		{"extra", [2]int{1, 2}, "reply 1 (reply kf.Text{Content:\"r1\"}) was made on the second run only"},
		{"missing", [2]int{2, 1}, "reply 1 (reply kf.Text{Content:\"r1\"}) was made on the first run only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rt := &recT{T: t}
			var run atomic.Int32
			h := New(rt, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
				for i := range c.counts[run.Add(1)-1] {
					if err := kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("r%d", i)}); err != nil {
						return err
					}
				}
				return nil
			}))
			h.RunTwice(Text("u", "hi"))
			switch {
			case c.want == "" && len(rt.errs) != 0:
				t.Fatalf("reported %q", rt.errs)
			case c.want != "" && (len(rt.errs) != 1 || !strings.Contains(rt.errs[0], c.want)):
				t.Fatalf("reported %q, want %q", rt.errs, c.want)
			}
		})
	}
}

// TestTimeoutsAndPanics: an attempt that outlives AttemptTimeout and one
// that panics are failed attempts; the last decides the reason.
func TestTimeoutsAndPanics(t *testing.T) {
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if text, _ := m.Text(); text == "panic" {
			panic("boom")
		}
		<-ctx.Done()
		return ctx.Err()
	}), Attempts(2), AttemptTimeout(20*time.Millisecond))
	h.Run(Text("u", "slow")).ExpectDeadLettered(ReasonProcessTimeout)
	r := h.Run(Text("u", "panic")).ExpectDeadLettered(ReasonDownstreamError)
	if r.Attempts != 2 || !strings.Contains(r.Err.Error(), "panicked: boom") {
		t.Fatalf("attempts %d, error %v", r.Attempts, r.Err)
	}
}

// TestRefusalIsPermanent: a reply WeChat refuses for good (a servicer's
// message to a user who never wrote: no session) dead-letters the message.
func TestRefusalIsPermanent(t *testing.T) {
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return kfpipe.Reply(ctx, kf.Text{Content: "hi"})
	}))
	r := h.Run(ServicerText("nobody", "alice", "hello")).ExpectPermanent()
	if len(r.Replies) != 1 || r.Replies[0].Outcome != Refused {
		t.Fatalf("replies %v", r.Replies)
	}
}

// TestRoutineRefusalFinishes: the sixth reply to one customer message is
// refused (WeChat's 5-replies window); a handler that returns that error
// finishes the message, as in the consumer.
func TestRoutineRefusalFinishes(t *testing.T) {
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		for i := range 6 {
			if err := kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprint(i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	r := h.Run(Text("u", "hi")).ExpectDone()
	if len(r.Replies) != 6 || r.Replies[5].Outcome != Refused || !errors.Is(r.Replies[5].Err, kfpipe.ErrReplyWindow) {
		t.Fatalf("replies %v", r.Replies)
	}
}

// TestSessionStateAndClient: a handler reads its customer's session state
// and reaches the WeChat client from its context; outside a handler both
// answer ErrNoReplier.
func TestSessionStateAndClient(t *testing.T) {
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if _, err := kfpipe.Client(ctx); err != nil {
			return err
		}
		if text, _ := m.Text(); text == "human" {
			_, err := kfpipe.Transfer(ctx, kf.StateServicer, "alice")
			return err
		}
		state, servicer, err := kfpipe.SessionState(ctx)
		if err != nil {
			return err
		}
		return kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("state %d %s", state, servicer)})
	}))
	h.Run(Text("u", "hi")).ExpectDone().ExpectTexts("state 0 ")
	h.Run(Text("u", "human")).ExpectDone()
	h.Run(Text("u", "and now?")).ExpectDone().ExpectTexts("state 3 alice")
	if _, _, err := kfpipe.SessionState(context.Background()); !errors.Is(err, kfpipe.ErrNoReplier) {
		t.Fatalf("SessionState outside a handler: %v", err)
	}
	if _, err := kfpipe.Client(context.Background()); !errors.Is(err, kfpipe.ErrNoReplier) {
		t.Fatalf("Client outside a handler: %v", err)
	}
}
