package kfpipe_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// replyWith is a route that answers text.
func replyWith(text string) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return kfpipe.Reply(ctx, kf.Text{Content: text})
	})
}

// TestRouterRoutes runs a Router under the test kit's real reply path:
// each kind of message reaches its route, in the documented order (menu id
// before keyword before type before default), a servicer's message and an
// unrouted event get no reply at all, and the middleware sees every
// message, routed or not.
func TestRouterRoutes(t *testing.T) {
	var seen []string
	r := kfpipe.NewRouter().
		Event(kfpipe.EventEnterSession, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			if ev, _ := m.Event(); ev.WelcomeCode == "" {
				return nil
			}
			return kfpipe.Welcome(ctx, kf.Text{Content: "welcome"})
		})).
		Menu("human", replyWith("menu:human")).
		Keyword(replyWith("keyword:human"), "human", "person").
		Keyword(replyWith("keyword:hours"), "hours").
		Type(kfpipe.MsgText, replyWith("type:text")).
		Type(kfpipe.MsgImage, replyWith("type:image")).
		Default(replyWith("default"))
	r.Use(func(next kfpipe.Handler) kfpipe.Handler {
		return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			seen = append(seen, m.MsgType)
			return next.Handle(ctx, m)
		})
	})
	h := kfpipetest.New(t, r)
	h.Run(kfpipetest.EnterSession("u1", "", "")).ExpectDone()
	if got := h.Replies(); len(got) != 1 || got[0].Kind != kfpipetest.KindWelcome {
		t.Fatalf("enter_session: replies %v, want one welcome", got)
	}
	for _, c := range []struct {
		m    *kfpipe.Message
		want string
	}{
		{kfpipetest.MenuClick("u1", "human", "hours"), "menu:human"}, // the id, not the item's text
		{kfpipetest.MenuClick("u1", "unknown", "Hours"), "keyword:hours"},
		{kfpipetest.Text("u1", "  PERSON "), "keyword:human"},
		{kfpipetest.Text("u1", "person please"), "type:text"},
		{kfpipetest.Image("u1", "media-1"), "type:image"},
		{kfpipetest.Location("u1", "Shop", "Main St 1", 31.2, 121.4), "default"},
	} {
		h.Run(c.m).ExpectDone().ExpectTexts(c.want)
	}
	h.Run(kfpipetest.ServicerText("u1", "alice", "human")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.SessionStatusChange("u1", 1, "", "alice")).ExpectDone().ExpectNoReplies()
	if want := "event text text text text image location text event"; strings.Join(seen, " ") != want {
		t.Fatalf("the middleware saw %q, want %q", strings.Join(seen, " "), want)
	}
}

// TestRouterServicerAndErrors: a Servicer route takes a servicer's
// messages; a route's error is the Router's, so the kit retries it.
func TestRouterServicerAndErrors(t *testing.T) {
	var servicer string
	fails := 1
	r := kfpipe.NewRouter().
		Servicer(kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			servicer = m.ServicerUserID
			return nil
		})).
		Default(kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			if fails > 0 {
				fails--
				return errors.New("the shop's API is down")
			}
			return kfpipe.Reply(ctx, kf.Text{Content: "ok"})
		}))
	h := kfpipetest.New(t, r)
	h.Run(kfpipetest.ServicerText("u1", "alice", "hello")).ExpectDone().ExpectNoReplies()
	if servicer != "alice" {
		t.Fatalf("the Servicer route got %q, want alice", servicer)
	}
	h.Run(kfpipetest.Text("u1", "hi")).ExpectRetried().ExpectTexts("ok")
	if r.Route(kfpipetest.ServicerText("u1", "bob", "x")) == nil || r.Route(kfpipetest.EnterSession("u1", "", "")) != nil {
		t.Fatal("Route: a servicer's message has the Servicer route, an unrouted event none")
	}
}
