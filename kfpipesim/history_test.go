package kfpipesim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// historyBot answers a customer with the earlier turns it was given.
var historyBot = kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
	if !m.FromCustomer() {
		return nil
	}
	turns, err := kfpipe.History(ctx, m, 10)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, t := range turns {
		text, _ := t.Text()
		fmt.Fprintf(&b, "%d:%s|", t.Origin, text)
	}
	return kfpipe.Reply(ctx, kf.Text{Content: "history " + b.String()})
})

// TestSimulatorHistory: in the simulator (no database) the bot's History
// holds the customer's earlier messages, its own replies and the
// servicer's, in order.
func TestSimulatorHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := start(ctx, historyBot, options{addr: "127.0.0.1:0", out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	post(t, s.url+"api/send", sendRequest{User: "h1", As: "customer", Text: "where is my parcel"})
	waitState(t, s.url, "h1", "the first reply", func(st state) bool { return len(st.Messages) >= 2 })
	id := post(t, s.url+"api/send", sendRequest{User: "h1", As: "servicer", Text: "it left today"})
	waitState(t, s.url, "h1", "the servicer's message handled", func(st state) bool {
		for _, m := range st.Messages {
			if m.MsgID == id && m.Status == "handled" {
				return true
			}
		}
		return false
	})
	post(t, s.url+"api/send", sendRequest{User: "h1", As: "customer", Text: "thanks"})
	// The bot's own first reply (OriginBot) is a turn too.
	want := fmt.Sprintf("history 3:where is my parcel|%d:history |5:it left today|", kfpipe.OriginBot)
	waitState(t, s.url, "h1", "the reply with the history", func(st state) bool {
		for _, m := range st.Messages {
			if m.Reply && m.Text == want {
				return true
			}
		}
		return false
	})
}
