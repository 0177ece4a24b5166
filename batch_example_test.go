package kfpipe_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// ExampleBatchHandlerFunc: a batch handler gets a user's consecutive
// messages together, in order, and can answer them as one question.
func ExampleBatchHandlerFunc() {
	bh := kfpipe.BatchHandlerFunc(func(_ context.Context, msgs []*kfpipe.Message) error {
		var parts []string
		for _, m := range msgs {
			if text, ok := m.Text(); ok && m.FromCustomer() {
				parts = append(parts, text)
			}
		}
		fmt.Printf("%d messages: %q\n", len(msgs), strings.Join(parts, " "))
		return nil
	})
	_ = bh.HandleBatch(context.Background(), []*kfpipe.Message{
		kfpipetest.Text("u1", "hi,"), kfpipetest.Text("u1", "my order 1234"), kfpipetest.Text("u1", "has not arrived"),
	})
	// Output: 3 messages: "hi, my order 1234 has not arrived"
}

// ExampleNewBatchConsumer runs a batch handler: up to 5 of a user's
// messages together, waiting up to 2 seconds for more when fewer are
// queued.
func ExampleNewBatchConsumer() {
	cfg, err := kfpipe.LoadConfig("config/development.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	bh := kfpipe.BatchHandlerFunc(func(ctx context.Context, msgs []*kfpipe.Message) error {
		return nil // answer msgs together
	})
	c, err := kfpipe.NewBatchConsumer(cfg, bh, 5, 2*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = c.Run(context.Background())
}
