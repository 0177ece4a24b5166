package kfpipe_test

import (
	"context"
	"fmt"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// A bot as a list of routes: events by type, a menu tap by its item's id,
// a text by keyword, any message by type, the rest to the default; a
// servicer's messages reach no customer route. Here each route prints
// what it got (a bot replies with kfpipe.Reply).
func ExampleRouter() {
	say := func(what string) kfpipe.Handler {
		return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			fmt.Println(what)
			return nil
		})
	}
	r := kfpipe.NewRouter().
		Event(kfpipe.EventEnterSession, say("welcome")).
		Menu("hours", say("opening hours (menu)")).
		Keyword(say("opening hours (typed)"), "hours", "open?").
		Type(kfpipe.MsgImage, say("a picture")).
		Default(say("echo"))
	r.Use(func(next kfpipe.Handler) kfpipe.Handler {
		return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
			fmt.Print(m.MsgType, ": ")
			return next.Handle(ctx, m)
		})
	})
	ctx := context.Background()
	for _, m := range []*kfpipe.Message{
		kfpipetest.EnterSession("u1", "", ""),
		kfpipetest.MenuClick("u1", "hours", "Opening hours"),
		kfpipetest.Text("u1", " Hours "),
		kfpipetest.Image("u1", "media-1"),
		kfpipetest.Text("u1", "where is my parcel?"),
		kfpipetest.ServicerText("u1", "alice", "hours"),
	} {
		_ = r.Handle(ctx, m)
	}
	fmt.Println()
	// Output:
	// event: welcome
	// text: opening hours (menu)
	// text: opening hours (typed)
	// image: a picture
	// text: echo
	// text:
}
