package kfpipetest

import (
	"context"
	"errors"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// handOff hands the customer who writes "human" to alice and sends the
// message of the hand-off with Transfer's msg_code; it answers any other
// text.
func handOff(codes *[]string) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() {
			return nil
		}
		text, _ := m.Text()
		if text != "human" {
			return kfpipe.Reply(ctx, kf.Text{Content: "bot: " + text})
		}
		code, err := kfpipe.Transfer(ctx, kf.StateServicer, "alice")
		if err != nil {
			return err
		}
		*codes = append(*codes, code)
		return kfpipe.SendEventMessage(ctx, code, kf.Text{Content: "alice will help you"})
	})
}

// TestTransferMsgCodeEventMessageOnce: Transfer returns WeChat's
// msg_code; the event message sent with it reaches the customer once
// however often the handler runs, and a re-run gets the first run's code.
func TestTransferMsgCodeEventMessageOnce(t *testing.T) {
	var codes []string
	h := New(t, handOff(&codes))
	first, second := h.RunTwice(Text("u1", "human"))
	first.ExpectDone()
	second.ExpectDone()
	if len(codes) != 2 || codes[0] == "" || codes[0] != codes[1] {
		t.Fatalf("msg_codes of the two runs: %q, want the same non-empty code", codes)
	}
	if got := h.Delivered("u1"); len(got) != 1 || got[0] != "alice will help you" {
		t.Fatalf("delivered %q, want the hand-off message once", got)
	}
	if r := second.LastCall(); len(r) != 2 || r[0].Kind != KindTransfer || r[1].Kind != KindEventMessage ||
		r[0].Outcome != Skipped || r[1].Outcome != Skipped {
		t.Fatalf("second run's replies %v, want the transfer and the event message skipped", r)
	}
	if h.SessionState("u1") != kf.StateServicer {
		t.Fatalf("session state %d, want servicer", h.SessionState("u1"))
	}
	// A msg_code is valid once: a second event message with it is a
	// routine refusal.
	h2 := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return kfpipe.SendEventMessage(ctx, "", kf.Text{Content: "x"})
	}))
	h2.Run(Text("u2", "hi")).ExpectPermanent()
}

// TestReplyWhileServicerHoldsSession: a bot's reply while a human servicer
// holds the session is refused by WeChat with 95018 and finishes the
// message as a skipped reply of its own outcome, not a dead letter.
func TestReplyWhileServicerHoldsSession(t *testing.T) {
	var codes []string
	h := New(t, handOff(&codes))
	h.Run(Text("u1", "hi")).ExpectDone().ExpectTexts("bot: hi")
	h.Run(Text("u1", "human")).ExpectDone()
	r := h.Run(Text("u1", "are you there?")).ExpectDone()
	if len(r.Replies) != 1 || r.Replies[0].Outcome != ServicerSession || !errors.Is(r.Replies[0].Err, kfpipe.ErrServicerSession) {
		t.Fatalf("replies %v, want one refused with servicer_session", r.Replies)
	}
	if r.Attempts != 1 {
		t.Fatalf("%d attempts: a refusal because a human serves is not retried", r.Attempts)
	}
	if got := h.Delivered("u1"); len(got) != 2 {
		t.Fatalf("delivered %q: the bot's reply during the human's session reached the customer", got)
	}
	// The servicer ends the session; the customer's next message opens a
	// new one and the bot answers again.
	h.Run(SessionStatusChange("u1", 3, "alice", "")).ExpectDone()
	h.Run(Text("u1", "back")).ExpectDone()
	if got := h.Delivered("u1"); len(got) != 3 || got[2] != "bot: back" {
		t.Fatalf("delivered %q, want the bot's answer after the session ended", got)
	}
}

// TestSessionStateCachedAndInvalidated: SessionState asks WeChat once and
// answers from the cache; the customer's session_status_change event drops
// the entry, so the next message reads the new state.
func TestSessionStateCachedAndInvalidated(t *testing.T) {
	var states []kf.State
	quiet := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		st, _, err := kfpipe.SessionState(ctx)
		if err != nil {
			return err
		}
		states = append(states, st)
		if text, _ := m.Text(); st == kf.StateServicer || !m.FromCustomer() || text == "peek" {
			return nil // a human serves: the bot stays quiet
		}
		return kfpipe.Reply(ctx, kf.Text{Content: "bot"})
	})
	h := New(t, quiet)
	h.Run(Text("u1", "a")).ExpectDone()
	// Changed at WeChat without an event: the cache still answers bot.
	h.SetSessionState("u1", kf.StateServicer, "bob")
	h.Run(Text("u1", "peek")).ExpectDone()
	if states[1] != kf.StateUntreated {
		t.Fatalf("second read %d, want the cached state (untreated), not WeChat's", states[1])
	}
	// The event announcing the change drops the cached state.
	h.Run(SessionStatusChange("u1", 1, "", "bob")).ExpectDone()
	r := h.Run(Text("u1", "c")).ExpectDone()
	if states[len(states)-1] != kf.StateServicer || len(r.Replies) != 0 {
		t.Fatalf("after the event: state %d, replies %v; want servicer and a quiet bot", states[len(states)-1], r.Replies)
	}
	if got := h.Delivered("u1"); len(got) != 1 {
		t.Fatalf("delivered %q, want the bot's one answer before the human took over", got)
	}

	// A stale cache (changed at WeChat, no event yet) is caught by
	// WeChat's 95018: the reply is skipped and the entry dropped.
	h.Run(Text("u2", "a")).ExpectDone()
	h.SetSessionState("u2", kf.StateServicer, "bob")
	r = h.Run(Text("u2", "b")).ExpectDone()
	if len(r.Replies) != 1 || r.Replies[0].Outcome != ServicerSession {
		t.Fatalf("replies %v, want one skipped with servicer_session", r.Replies)
	}
	h.Run(Text("u2", "c")).ExpectDone()
	if states[len(states)-1] != kf.StateServicer {
		t.Fatalf("after 95018 the state read %d, want servicer", states[len(states)-1])
	}
}
