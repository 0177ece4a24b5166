package kfpipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/service"
)

// BatchHandler handles a user's consecutive messages together: a customer
// who splits one question over several messages is answered once, from all
// of them (NewBatchConsumer). It must be safe for concurrent use (other
// users' batches) and return when ctx ends.
//
// msgs are one user's messages, in the order the user sent them, at least
// one; a message already done (an earlier run handled it) is left out.
// nil finishes every message of the batch; an error is retried in place
// with the same messages and then dead-letters each of them (one letter
// per message, in order, retried from the DLQ later on its own);
// Permanent(err) dead-letters them at once.
//
// The replies the handler makes (Reply, Welcome, Transfer) are keyed by
// the batch's first message: (open_kfid, upstream msgid of msgs[0], reply
// number within the call). See docs/handlers.md for what a re-run after a
// crash is handed and why it replies the same way.
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []*Message) error
}

// BatchHandlerFunc is a function used as a BatchHandler.
type BatchHandlerFunc func(ctx context.Context, msgs []*Message) error

// HandleBatch calls f.
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, msgs []*Message) error {
	return f(ctx, msgs)
}

// batchRun is NewBatchConsumer's handler and bounds.
type batchRun struct {
	bh   BatchHandler
	size int
	wait time.Duration
}

// NewBatchConsumer returns a consumer that hands bh each user's
// consecutive messages together: the messages of the user already queued
// when the previous batch is done, plus those arriving within wait, at most
// size (2 to processor.mailbox_size). wait is the latency a batch that is
// not full adds (0: only what is already queued, no added latency). Run
// runs it as it runs NewConsumer's; WithMiddleware does not apply (it
// wraps a Handler).
func NewBatchConsumer(cfg *Config, bh BatchHandler, size int, wait time.Duration, opts ...ConsumerOption) (*Consumer, error) {
	if cfg == nil {
		return nil, errors.New("kfpipe: NewBatchConsumer needs a configuration (LoadConfig)")
	}
	if bh == nil {
		return nil, errors.New("kfpipe: NewBatchConsumer needs a batch handler")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if size < 2 || size > cfg.Processor.MailboxSize {
		return nil, fmt.Errorf("kfpipe: NewBatchConsumer: size must be 2 to processor.mailbox_size (%d), got %d",
			cfg.Processor.MailboxSize, size)
	}
	if wait < 0 {
		return nil, fmt.Errorf("kfpipe: NewBatchConsumer: wait must not be negative, got %v", wait)
	}
	c := &Consumer{cfg: *cfg, batch: &batchRun{bh: bh, size: size, wait: wait}}
	for _, o := range opts {
		o(c)
	}
	if c.h != nil {
		return nil, errors.New("kfpipe: NewBatchConsumer: WithMiddleware wraps a Handler, a batch consumer has none")
	}
	return c, nil
}

// handler returns the consumer's handler for the internal consumer and the
// options that go with it.
func (c *Consumer) handler() (handler.Handler, []service.ConsumerOption) {
	if c.batch == nil {
		return adapt(c.h), nil
	}
	return adaptBatch(c.batch.bh), []service.ConsumerOption{service.WithBatch(c.batch.size, c.batch.wait)}
}

// adaptBatch turns bh into the consumer's handler in batch mode: it is
// called with the batch's first message and the batch in ctx.
func adaptBatch(bh BatchHandler) handler.Handler {
	return handler.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		items := handler.BatchFrom(ctx)
		if len(items) == 0 {
			items = []handler.BatchItem{{Msg: c, Delivery: handler.DeliveryFrom(ctx)}}
		}
		msgs := make([]*Message, len(items))
		for i, it := range items {
			m := fromChat(it.Msg)
			m.RetryFromDLQ, m.RetryCount = it.Delivery.RetryFromDLQ, it.Delivery.RetryCount
			msgs[i] = m
		}
		return bh.HandleBatch(ctx, msgs)
	})
}
