// Command handoffbot is a customer-service bot for a shop's after-sales
// desk, written against kfpipe's public API only. A customer who sends a
// photo (of a damaged parcel, a wrong item) gets a thank-you and is handed
// to a human servicer, with WeChat's event message about the hand-off
// (Transfer's msg_code, SendEventMessage). While the human serves, the bot
// stays quiet: it reads the session state (kfpipe.SessionState, cached by
// the consumer and refreshed by WeChat's session_status_change events)
// before it answers. If WeChat still refuses a reply because a human took
// the session a moment ago (errcode 95018), the reply is recorded as
// skipped (kfpipe.ErrServicerSession) — the message is finished, not
// dead-lettered.
//
//	handoffbot --config config.yaml   (HANDOFFBOT_SERVICER: the servicer's userid)
//	handoffbot --simulate             chat with it on http://127.0.0.1:8095/
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

// The bot's words.
const (
	welcome     = "Hello! Send us a photo of your parcel and a colleague will take care of it."
	thanks      = "Thanks for the photo! I'm passing it to a colleague who can look at it."
	thanksSized = "Thanks for the photo (%d KB)! I'm passing it to a colleague who can look at it."
	handOver    = "Your photo is with %s now; they will answer you here."
	help        = "I can help with photos of your order: send one, or type \"human\" to talk to a person."
)

// bot is the handler, a kfpipe.Router; servicer is who photos are handed
// to. The Router finishes a servicer's own messages and the events it has
// no route for (session_status_change: the consumer drops its cached
// state on its own) unanswered.
func bot(servicer string) kfpipe.Handler {
	r := kfpipe.NewRouter()
	r.Use(quietWhileHumanServes)
	r.Event(kfpipe.EventEnterSession, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if ev, _ := m.Event(); ev.WelcomeCode == "" {
			return nil // WeChat gave no welcome_code: no welcome may be sent
		}
		return kfpipe.Welcome(ctx, kf.Text{Content: welcome})
	}))
	r.Type(kfpipe.MsgImage, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return handOff(ctx, servicer, thanksFor(ctx, m))
	}))
	r.Keyword(kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return handOff(ctx, servicer, "Connecting you to a person...")
	}), "human")
	// A reply refused because a human took the session since the state
	// was read is kfpipe.ErrServicerSession: returning it finishes the
	// message as a skipped reply.
	r.Default(kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		return kfpipe.Reply(ctx, kf.Text{Content: help})
	}))
	return r
}

// quietWhileHumanServes is the Router's middleware: a customer's message
// while a human serves (or will: queued) goes to no route.
func quietWhileHumanServes(next kfpipe.Handler) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() {
			return next.Handle(ctx, m)
		}
		state, _, err := kfpipe.SessionState(ctx)
		if err != nil {
			return err
		}
		if state == kf.StateServicer || state == kf.StateQueue {
			return nil
		}
		return next.Handle(ctx, m)
	})
}

// thanksFor is the thank-you for the photo in m: with its size when the
// media store has it (kf-producer and the consumer keep every inbound
// media object there before the handler runs, so a retry days later still
// finds it: docs/media.md). The size does not change between runs, so the
// reply is the same when the handler runs again.
func thanksFor(ctx context.Context, m *kfpipe.Message) string {
	obj, err := kfpipe.OpenMedia(ctx, m)
	if err != nil {
		return thanks // refused (too large), or expired before it was kept: no size
	}
	defer obj.Close()
	return fmt.Sprintf(thanksSized, obj.Size/1024+1)
}

// handOff says say, hands the customer to servicer and sends WeChat's
// event message about the hand-off, each once per message.
func handOff(ctx context.Context, servicer, say string) error {
	if err := kfpipe.Reply(ctx, kf.Text{Content: say}); err != nil {
		return err
	}
	code, err := kfpipe.Transfer(ctx, kf.StateServicer, servicer)
	if err != nil {
		return err
	}
	if code == "" {
		return nil // WeChat gave no msg_code: nothing more to say
	}
	err = kfpipe.SendEventMessage(ctx, code, kf.Text{Content: fmt.Sprintf(handOver, servicer)})
	if errors.Is(err, kfpipe.ErrWelcomeCodeExpired) {
		return nil // the code lived 20 s; the hand-off itself is done
	}
	return err
}

func main() {
	servicer := os.Getenv("HANDOFFBOT_SERVICER")
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
	err := kfpipesim.Main(ctx, os.Args[1:], h)
	if err != nil && (ctx.Err() == nil || !errors.Is(err, context.Canceled)) {
		fmt.Fprintln(os.Stderr, "handoffbot:", err)
		os.Exit(1)
	}
}
