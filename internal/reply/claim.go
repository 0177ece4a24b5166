package reply

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/handler"
	statestore "github.com/kfpipe/kfpipe/internal/state"
)

// A reply is an effect under the partition's ownership. Before it is sent:
//   - the owner checks its lease's local deadline (handler.OwnedUntil, no
//     round trip): past it nothing is sent, the message is retried under
//     the next lease;
//   - the reply is looked up and claimed in one call, the claim carrying
//     the lease's fencing token and lasting until the send certainly ended
//     (handler.ReplyClaimer). A newer owner meeting an older owner's live
//     claim waits for its record or for the claim to run out; an older
//     owner meeting a newer one's claim is told (the reply is not its to
//     send).
//
// A send that started is not cut: a request cancelled while WeChat has it
// may have been delivered, and nothing tells the next run it was. So the
// send's context is not the handler's (cancelled exactly when ownership
// is lost) but its own, lasting what is left of the lease and at least
// one request's timeout, and the claim lasts that long plus claimSlack: a
// newer owner waits for it to end. Whether the lease still holds is
// checked just before the request leaves (after any wait for a slot under
// the replies' limit); a request sent then ends, by WeChat's answer or by
// the client's own timeout, before the claim does. Its record is written
// with a context of its own too, and retried like a done mark.

// claimSlack is what a claim lasts beyond the send's own deadline: a
// request the client gave up on may still be read by WeChat a moment
// later.
const claimSlack = time.Second

// claimPoll bounds the wait between two looks at an older owner's claim.
const claimPoll = 200 * time.Millisecond

// recordTimeout bounds one write of a reply's record; recordRetryFor is
// how long a record that could not be written is tried again (the done
// marks' horizon through a Redis outage).
const (
	recordTimeout  = 5 * time.Second
	recordRetryFor = 10 * time.Minute
)

// claim looks the reply it up in log and, when it is not recorded, claims
// it under the handler's lease. It returns the record when the reply was
// recorded (done), else the context to send it with (ending at the
// lease's deadline) and its cancel.
func (fx *Effects) claim(ctx context.Context, log handler.ReplyLog, it handler.StateItem) (record string, done bool, sctx context.Context, cancel context.CancelFunc, err error) {
	nop := func() {}
	if v, ok := fx.recording.Load(it.Key); ok {
		return v.(string), true, ctx, nop, nil // sent here; its record is still being written
	}
	until, owned, err := handler.OwnedUntil(ctx)
	if err != nil {
		return "", false, nil, nop, err
	}
	claimer, ok := log.(handler.ReplyClaimer)
	if !owned || !ok {
		record, done, err = log.Replied(ctx, it)
	} else {
		for {
			var wait time.Duration
			record, done, wait, err = claimer.ClaimReply(ctx, it, fx.sendBudget(until)+claimSlack)
			if errors.Is(err, statestore.ErrReplyFenced) {
				err = fmt.Errorf("%w: %w", handler.ErrNotOwner, err)
			}
			if err != nil || done || wait == 0 {
				break
			}
			// An older owner claimed it and may be sending it now: its
			// record, or its claim's end, decides.
			fx.log.Info("reply claimed by an older owner of the partition; waiting for its record",
				zap.String("reply_key", it.Key), zap.Duration("claim_left", wait))
			t := time.NewTimer(min(wait, claimPoll))
			select {
			case <-ctx.Done():
				t.Stop()
				return "", false, nil, nop, fmt.Errorf("wait for an older owner's claim: %w", ctx.Err())
			case <-t.C:
			}
			if until, _, err = handler.OwnedUntil(ctx); err != nil {
				return "", false, nil, nop, err
			}
		}
	}
	if err == nil && !done && fx.legacy != nil {
		record, done, err = fx.legacy.replied(ctx, it.Key)
	}
	if err != nil || done || !owned {
		return record, done, ctx, nop, err
	}
	sctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), fx.sendBudget(until))
	return "", false, sctx, cancel, nil
}

// sendBudget is how long a send claimed now may take: what is left of the
// lease (until), and at least one request's timeout.
func (fx *Effects) sendBudget(until time.Time) time.Duration {
	return max(time.Until(until), fx.sendTimeout)
}

// record writes the record of the reply it, sent: with a context of its
// own, and, when that fails, again in the background for up to
// recordRetryFor (meanwhile a run of the same handler in this process
// finds the reply sent).
func (fx *Effects) record(ctx context.Context, log handler.ReplyLog, it handler.StateItem, record string) {
	base := context.WithoutCancel(ctx)
	try := func() error {
		rctx, cancel := context.WithTimeout(base, recordTimeout)
		defer cancel()
		return log.RecordReply(rctx, it, record)
	}
	err := try()
	if err == nil {
		return
	}
	fx.recording.Store(it.Key, record)
	fx.log.Warn("reply sent, its record not written yet; retrying", zap.String("reply_key", it.Key), zap.Error(err))
	go func() {
		defer fx.recording.Delete(it.Key)
		backoff := 50 * time.Millisecond
		for start := time.Now(); time.Since(start) < recordRetryFor; {
			time.Sleep(backoff)
			if err = try(); err == nil {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
		fx.log.Error("reply sent, its record given up; a run of the handler for the message after the claim ran out sends it again",
			zap.String("reply_key", it.Key), zap.Error(err))
	}()
}
