package kfpipetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// joiner answers a batch of a customer's texts with one reply.
var joiner = kfpipe.BatchHandlerFunc(func(ctx context.Context, msgs []*kfpipe.Message) error {
	var parts []string
	for _, m := range msgs {
		if text, ok := m.Text(); ok && m.FromCustomer() {
			parts = append(parts, text)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + strings.Join(parts, " ")})
})

func TestRunBatch(t *testing.T) {
	hs := kfpipetest.NewBatch(t, joiner)
	a, b, c := kfpipetest.Text("u1", "my order"), kfpipetest.Text("u1", "1234"), kfpipetest.Text("u1", "is late")
	res := hs.RunBatch(a, b, c).ExpectDone().ExpectTexts("You said: my order 1234 is late")
	if res.Message != a || len(res.Batch) != 3 {
		t.Fatalf("result of the batch: message %v, batch %v", res.Message, res.Batch)
	}
	// A re-run after a crash (same first message): the reply is keyed by
	// it and not sent again.
	hs.RunBatch(a, b, c).ExpectDone()
	if got := hs.Delivered("u1"); len(got) != 1 || got[0] != "You said: my order 1234 is late" {
		t.Fatalf("delivered %q, want the batch's one reply once", got)
	}
	// Run hands a batch handler a batch of one.
	hs.Run(kfpipetest.Text("u1", "thanks")).ExpectTexts("You said: thanks")
}

func TestRunBatchFailure(t *testing.T) {
	hs := kfpipetest.NewBatch(t, kfpipe.BatchHandlerFunc(func(context.Context, []*kfpipe.Message) error {
		return kfpipe.Permanent(errors.New("no"))
	}))
	hs.RunBatch(kfpipetest.Text("u1", "a"), kfpipetest.Text("u1", "b")).ExpectPermanent().ExpectDeadLettered(kfpipetest.ReasonHandlerRejected)
}

// ExampleHarness_RunBatch unit-tests a batch handler (a consumer made by
// kfpipe.NewBatchConsumer): one reply for a customer's three messages.
func ExampleHarness_RunBatch() {
	t := &printT{}
	defer t.done()
	hs := kfpipetest.NewBatch(t, joiner)
	res := hs.RunBatch(kfpipetest.Text("u1", "hello,"), kfpipetest.Text("u1", "where is"), kfpipetest.Text("u1", "my parcel?"))
	fmt.Println(res.Outcome, len(res.Batch), res.Texts())
	// Output: done 3 [You said: hello, where is my parcel?]
}
