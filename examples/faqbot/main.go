// Command faqbot is a customer-service bot written against kfpipe's public
// API only: it welcomes a customer who opens a session, answers a few
// questions, shows a menu for "menu", and hands the customer to a human
// servicer on "human". Every reply reaches the customer once, even when a
// consumer crashes and the message is handled again.
//
//	faqbot --config config.yaml   (FAQBOT_SERVICER: the servicer's userid)
//	faqbot --simulate             chat with it on http://127.0.0.1:8095/
//	                              (kfpipesim: the whole pipeline in-process)
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipesim"
)

// faq maps a keyword to its answer.
var faq = map[string]string{
	"hours":    "We are open 9:00-18:00, Monday to Saturday.",
	"shipping": "Orders ship within 24 hours; delivery takes 2-3 days.",
	"refund":   "Refunds go back to your payment method within 7 days.",
}

// menu is what "menu" answers; a tap comes back as a text message whose
// MenuID is the item's ID.
var menu = kf.Menu{
	HeadContent: "How can we help?",
	Items: []kf.MenuItem{
		{ID: "hours", Content: "Opening hours"},
		{ID: "shipping", Content: "Shipping"},
		{ID: "human", Content: "Talk to a person"},
	},
	TailContent: "Or type your question.",
}

// bot is the handler.
func bot(servicer string) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if ev, ok := m.Event(); ok {
			if ev.Type == kfpipe.EventEnterSession && ev.WelcomeCode != "" {
				return kfpipe.Welcome(ctx, kf.Text{Content: "Welcome! Type \"menu\" to see what I can do."})
			}
			return nil
		}
		if !m.FromCustomer() {
			// A servicer's own message reaches the handler too: it is not
			// the bot's to answer.
			return nil
		}
		text, ok := m.Text()
		if !ok {
			return kfpipe.Reply(ctx, kf.Text{Content: "Sorry, I can only read text."})
		}
		key := strings.ToLower(strings.TrimSpace(text))
		if id := m.MenuID(); id != "" {
			key = id
		}
		switch {
		case key == "menu":
			return kfpipe.Reply(ctx, menu)
		case key == "human":
			if err := kfpipe.Reply(ctx, kf.Text{Content: "Connecting you to a person..."}); err != nil {
				return err
			}
			_, err := kfpipe.Transfer(ctx, kf.StateServicer, servicer)
			return err
		case faq[key] != "":
			return kfpipe.Reply(ctx, kf.Text{Content: faq[key]})
		default:
			return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
		}
	})
}

func main() {
	servicer := os.Getenv("FAQBOT_SERVICER")
	if servicer == "" {
		servicer = "servicer-1"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h := kfpipe.Chain(bot(servicer), kfpipe.Logging(func(m *kfpipe.Message, err error, took time.Duration) {
		if err != nil {
			log.Printf("message %s of %s: %v (%s)", m.UpstreamMsgID, m.ExternalUserID, err, took)
		}
	}))
	// --simulate runs the chat simulator, anything else the consumer.
	err := kfpipesim.Main(ctx, os.Args[1:], h)
	if err != nil && (ctx.Err() == nil || !errors.Is(err, context.Canceled)) {
		fmt.Fprintln(os.Stderr, "faqbot:", err)
		os.Exit(1)
	}
}
