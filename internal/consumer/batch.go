package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Batch mode (WithBatch): a user's actor hands the handler the user's
// consecutive queued messages together instead of one by one.
//
//   - A batch is the messages already in the user's mailbox when the actor
//     takes the next one, plus those arriving within the wait, at most max,
//     in partition order, all of one partition.
//   - Dedup is per message: the messages the state store holds as done are
//     left out (finished as duplicates); the handler gets the others. With
//     none left it is not called.
//   - The handler is called once per batch: Handle with the batch's first
//     message, and BatchFrom(ctx) returning the whole batch. Retries, the
//     attempt timeout, the outage gate and the fencing token are those of
//     one message.
//   - Success: each message gets its own done mark, queued from the last
//     message to the first, so the first is marked last: until it is done,
//     a re-run batch begins with the same first message (the exactly-once
//     replies are keyed by it: docs/handlers.md).
//   - Failure after the attempts, or Permanent: each message of the batch
//     becomes its own dead letter, in order, with the batch's reason and
//     attempts. A message that cannot be decoded is dead-lettered alone and
//     left out of the batch.
type batchMode struct {
	max    int
	wait   time.Duration
	handle func([]*envelope)
}

// WithBatch makes the consumer hand each user's consecutive queued
// messages to the handler together: up to size messages, waiting up to wait
// for more when fewer are queued (0: only those already queued). The
// handler is called with the batch's first message and BatchFrom(ctx)
// returns the batch. size 1 or less leaves batching off (the default).
func WithBatch(size int, wait time.Duration) Option {
	return func(c *Consumer) { c.batchMode = batchMode{max: size, wait: max(wait, 0)} }
}

// installBatch turns batch mode on in the actors' registry when WithBatch
// asked for it.
func (c *Consumer) installBatch() {
	if c.batchMode.max > 1 {
		c.batchMode.handle = c.processBatch
		c.acts.batch = c.batchMode
	}
}

// BatchItem is one message of a batch with its delivery.
type BatchItem struct {
	Msg      *chatmsg.ChatMessage
	Delivery Delivery
}

type batchKey struct{}

// BatchFrom returns the batch the handler call ctx belongs to, in order
// (nil outside batch mode). Its first message is the one Handle got.
func BatchFrom(ctx context.Context) []BatchItem {
	b, _ := ctx.Value(batchKey{}).([]BatchItem)
	return b
}

// WithBatchItems returns ctx carrying items as its batch (for tests and
// harnesses that call a handler in batch mode without a consumer).
func WithBatchItems(ctx context.Context, items []BatchItem) context.Context {
	return context.WithValue(ctx, batchKey{}, items)
}

// wake signals a batch wait (called under a.mu).
func (a *actor) wake() {
	if a.full != nil {
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

// runBatch takes the next batch off the mailbox and handles it. It is
// called from run with a.mu held and the mailbox not empty, and returns
// with a.mu unlocked.
func (a *actor) runBatch() {
	b := &a.reg.batch
	if len(a.queue)-a.head < b.max && b.wait > 0 && a.state.Load() == stateActive {
		full := make(chan struct{}, 1)
		a.full = full
		a.mu.Unlock()
		t := a.reg.clock.AfterFunc(b.wait, func() {
			select {
			case full <- struct{}{}:
			default:
			}
		})
		<-full
		t.Stop()
		a.mu.Lock()
		a.full = nil
	}
	first := a.queue[a.head]
	end := a.head + 1
	for end < len(a.queue) && end-a.head < b.max && a.queue[end].part == first.part {
		end++
	}
	batch := make([]*envelope, end-a.head)
	copy(batch, a.queue[a.head:end])
	clear(a.queue[a.head:end])
	a.head = end
	a.mu.Unlock()
	b.handle(batch)
}

// processBatch is process for a batch: decode, dedup, handle with retry,
// then finish every message or dead-letter each.
func (c *Consumer) processBatch(envs []*envelope) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("actor panic", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	if envs[0].part.dropped.Load() || c.runCtx.Err() != nil {
		return
	}
	live := make([]*envelope, 0, len(envs))
	for _, env := range envs {
		if env.msg == nil {
			msg, err := chatmsg.Decode(env.km.Value)
			if err != nil {
				c.breakerOutcome(env, true)
				c.deadLetter(env, ReasonInvalidMessage, err.Error(), 0)
				continue
			}
			env.msg = msg
		}
		live = append(live, env)
	}
	if len(live) == 0 {
		return
	}
	var dup []bool
	var err error
	for backoff := c.cfg.Processor.RetryBase; ; {
		dup, err = c.handleBatchOnce(live)
		var hf *handlerFailure
		if err == nil || errors.As(err, &hf) || errors.Is(err, errStopping) || c.runCtx.Err() != nil {
			break
		}
		c.log.Warn("state: batch not settled; retrying", zap.String("user_id", live[0].msg.ExternalUserID),
			zap.String("dedup_key", live[0].msg.DedupKey()), zap.Int("messages", len(live)), zap.Error(err))
		if !sleep(c.runCtx, c.clock, backoff) || live[0].part.dropped.Load() {
			return
		}
		backoff = min(2*backoff+time.Millisecond, c.cfg.Processor.RetryMax)
	}
	if c.runCtx.Err() != nil || errors.Is(err, errStopping) {
		return
	}
	var hf *handlerFailure
	failed := errors.As(err, &hf)
	if err != nil && !failed {
		return // not reached: the loop ends on these errors only
	}
	for i, env := range live {
		switch {
		case dup[i]:
			c.m.duplicates.Inc()
			c.m.result(resultDuplicate).Inc()
			c.breakerOutcome(env, true)
			c.finish(env)
		case !failed:
			c.m.result(resultOK).Inc()
			if m := env.msg; m.ProducedAt > 0 {
				c.m.latency.Observe(c.clock.Now().Sub(time.UnixMilli(m.ProducedAt)).Seconds())
			}
			c.breakerOutcome(env, true)
			c.finish(env)
		default:
			c.breakerOutcome(env, false)
			reason := ReasonDownstreamError
			switch {
			case IsPermanent(hf.err):
				reason = ReasonInvalidMessage
			case hf.timedOut:
				reason = ReasonProcessTimeout
			}
			c.deadLetter(env, reason, fmt.Sprintf("batch of %d: %s", len(live), hf.err.Error()), hf.attempts)
		}
	}
}

// handleBatchOnce is handleOnce for a batch: dup[i] reports live[i] done
// already (left out of the handler's batch). On success every other
// message's done mark is queued, the last message's first.
func (c *Consumer) handleBatchOnce(live []*envelope) (dup []bool, err error) {
	dup = make([]bool, len(live))
	run := func(ctx context.Context, g *claimGuard, todo []*envelope) error {
		items := make([]BatchItem, len(todo))
		for i, env := range todo {
			items[i] = BatchItem{Msg: env.msg, Delivery: DeliveryFrom(withDelivery(context.Background(), env.km))}
		}
		attempts, timedOut, err := c.handleWithRetry(WithBatchItems(ctx, items), todo[0], g)
		if err == nil {
			return nil
		}
		if errors.Is(err, errStopping) || errors.Is(err, errClaimLost) {
			return err
		}
		return &handlerFailure{err: err, attempts: attempts, timedOut: timedOut}
	}
	pl := live[0].part.lease
	if pl == nil {
		return dup, run(c.runCtx, nil, live) // no State: every message runs
	}
	l, ok := c.leaseOf(pl)
	if !ok {
		return dup, errStopping
	}
	var look []StateItem
	var lookAt []int
	for i, env := range live {
		m := env.msg
		it := StateItem{Key: m.DedupKey(), SendTime: m.SendTime, User: m.ExternalUserID}
		if pl.isPending(it.Key) {
			dup[i] = true
			continue
		}
		look = append(look, it)
		lookAt = append(lookAt, i)
	}
	if len(look) > 0 {
		seen, err := l.Seen(c.runCtx, look)
		if err != nil {
			return dup, fmt.Errorf("state: look up %d messages from %s: %w", len(look), look[0].Key, err)
		}
		for j, s := range seen {
			if s {
				dup[lookAt[j]] = true
			}
		}
	}
	todo := make([]*envelope, 0, len(live))
	for i, env := range live {
		if !dup[i] {
			todo = append(todo, env)
		}
	}
	if len(todo) == 0 {
		return dup, nil
	}
	g := &todo[0].guard
	if err := c.underLease(c.runCtx, l, g, func(ctx context.Context) error { return run(ctx, g, todo) }); err != nil {
		return dup, err
	}
	for i := len(todo) - 1; i >= 0; i-- {
		m := todo[i].msg
		c.markDone(pl, l, todo[i], StateItem{Key: m.DedupKey(), SendTime: m.SendTime, User: m.ExternalUserID})
	}
	return dup, nil
}
