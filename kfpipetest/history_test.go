package kfpipetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// contextBot answers with the conversation it was given: each earlier
// turn as who:text, as an LLM-backed bot builds its prompt.
func contextBot() kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() {
			return nil
		}
		turns, err := kfpipe.History(ctx, m, 10)
		if err != nil {
			return err
		}
		var b strings.Builder
		for _, t := range turns {
			who := "customer"
			switch t.Origin {
			case kfpipe.OriginServicer:
				who = "servicer " + t.Servicer
			case kfpipe.OriginBot:
				who = "bot"
			}
			text, _ := t.Text()
			fmt.Fprintf(&b, "%s:%s|", who, text)
		}
		text, _ := m.Text()
		return kfpipe.Reply(ctx, kf.Text{Content: b.String() + "now:" + text})
	})
}

// History gives the handler the customer's earlier turns, a human
// servicer's and the bot's own replies included, oldest first, without
// the message being handled or another customer's; a retry sees the same.
func TestHistoryInHandler(t *testing.T) {
	h := New(t, contextBot())
	h.Run(Text("u1", "hello")).ExpectDone().ExpectTexts("now:hello")
	h.Run(Text("u2", "other customer")).ExpectDone()
	h.Remember(ServicerText("u1", "alice", "I am looking at your order"))
	h.Run(Text("u1", "thanks")).ExpectDone().ExpectTexts(
		"customer:hello|bot:now:hello|servicer alice:I am looking at your order|now:thanks")
	first, second := h.RunTwice(Text("u1", "and?"))
	first.ExpectDone().ExpectTexts("customer:hello|bot:now:hello|servicer alice:I am looking at your order|customer:thanks|" +
		"bot:customer:hello|bot:now:hello|servicer alice:I am looking at your order|now:thanks|now:and?")
	second.ExpectDone()
}

// Outside the consumer, the test kit and the simulator, History says no
// history is configured.
func TestHistoryWithoutSource(t *testing.T) {
	if _, err := kfpipe.History(context.Background(), Text("u1", "x"), 5); err != kfpipe.ErrNoHistory {
		t.Fatalf("History without a source: %v, want ErrNoHistory", err)
	}
}
