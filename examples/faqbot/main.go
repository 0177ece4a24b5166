// Command faqbot is a customer-service bot written against kfpipe's public
// API only: it welcomes a customer who opens a session, answers a few
// questions, shows a menu for "menu", says how large a picture is, and
// hands the customer to a human servicer on "human". Every reply reaches the customer once, even when a
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

// bot is the handler: a kfpipe.Router, one route per thing the bot
// does. The Router finishes a servicer's own messages and the events it
// has no route for unanswered: they are not the bot's to answer.
func bot(servicer string) kfpipe.Handler {
	r := kfpipe.NewRouter()
	r.Event(kfpipe.EventEnterSession, kfpipe.HandlerFunc(welcome))
	r.Keyword(say(menu), "menu")
	human := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if err := kfpipe.Reply(ctx, kf.Text{Content: "Connecting you to a person..."}); err != nil {
			return err
		}
		_, err := kfpipe.Transfer(ctx, kf.StateServicer, servicer)
		return err
	})
	r.Keyword(human, "human")
	r.Menu("human", human)
	for key, answer := range faq {
		// Typed ("Hours") or tapped in the menu (its item's id).
		r.Keyword(say(kf.Text{Content: answer}), key)
		r.Menu(key, say(kf.Text{Content: answer}))
	}
	r.Type(kfpipe.MsgText, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		text, _ := m.Text()
		return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
	}))
	r.Type(kfpipe.MsgImage, kfpipe.HandlerFunc(picture))
	r.Default(say(kf.Text{Content: "Sorry, I can only read text."}))
	return r
}

// welcome greets a customer who opens a session, when WeChat gave a
// welcome_code: it gives one only to a customer who got no welcome and
// sent no message in the last 48 hours; without it nothing may be sent.
func welcome(ctx context.Context, m *kfpipe.Message) error {
	if ev, _ := m.Event(); ev.WelcomeCode == "" {
		return nil
	}
	return kfpipe.Welcome(ctx, kf.Text{Content: "Welcome! Type \"menu\" to see what I can do."})
}

// picture answers a customer's picture with its size, read from the
// media store (kfpipe.OpenMedia: kept before the handler ran, so a re-run
// days later reads the same size and replies the same way).
func picture(ctx context.Context, m *kfpipe.Message) error {
	obj, err := kfpipe.OpenMedia(ctx, m)
	if err != nil {
		// No media store configured, or WeChat's 3 days passed before it
		// was kept: a reply without the size.
		return kfpipe.Reply(ctx, kf.Text{Content: "Thanks for the picture."})
	}
	defer obj.Close()
	return kfpipe.Reply(ctx, kf.Text{Content: fmt.Sprintf("Thanks for the picture (%d KB).", (obj.Size+1023)/1024)})
}

// say is a route that replies msg.
func say(msg kf.Message) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error { return kfpipe.Reply(ctx, msg) })
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
