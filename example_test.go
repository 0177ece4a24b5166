package kfpipe_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// ExampleChain wraps a handler in middleware: the first is the outermost,
// so its after-part runs last.
func ExampleChain() {
	trace := func(name string) kfpipe.Middleware {
		return func(next kfpipe.Handler) kfpipe.Handler {
			return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
				fmt.Println("before", name)
				err := next.Handle(ctx, m)
				fmt.Println("after", name)
				return err
			})
		}
	}
	h := kfpipe.Chain(kfpipe.HandlerFunc(func(context.Context, *kfpipe.Message) error {
		fmt.Println("handler")
		return nil
	}), trace("a"), trace("b"))
	_ = h.Handle(context.Background(), &kfpipe.Message{})
	// Output:
	// before a
	// before b
	// handler
	// after b
	// after a
}

// ExamplePermanent: a message the handler can never process is marked
// Permanent, so it is dead-lettered at once instead of retried.
func ExamplePermanent() {
	h := kfpipe.HandlerFunc(func(_ context.Context, m *kfpipe.Message) error {
		if _, ok := m.Text(); !ok {
			return kfpipe.Permanent(errors.New("only text is supported"))
		}
		return nil
	})
	err := h.Handle(context.Background(), &kfpipe.Message{MsgType: "image"})
	fmt.Println(kfpipe.IsPermanent(err))
	// Output: true
}

// ExampleReply: outside a consumer run by RunConsumer there is nobody to
// reply through, and Reply says so.
func ExampleReply() {
	err := kfpipe.Reply(context.Background(), kf.Text{Content: "hello"})
	fmt.Println(errors.Is(err, kfpipe.ErrNoReplier))
	// Output: true
}

// ExampleTimeout bounds each handler call.
func ExampleTimeout() {
	h := kfpipe.Chain(kfpipe.HandlerFunc(func(ctx context.Context, _ *kfpipe.Message) error {
		<-ctx.Done()
		return ctx.Err()
	}), kfpipe.Timeout(10*time.Millisecond))
	fmt.Println(h.Handle(context.Background(), &kfpipe.Message{}))
	// Output: context deadline exceeded
}
