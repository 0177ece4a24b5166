package consumer

import (
	"context"

	"github.com/kfpipe/kfpipe/internal/handler"
)

// Admitter is implemented by a Lease whose done marks bound the
// effect→mark window by backpressure (the state store's: issue 43): Admit
// returns when the partition may start another handler attempt, and
// waits while the partition's marks are unwritten for longer than a small
// bound or cannot be written at all.
type Admitter interface {
	Admit(ctx context.Context) error
}

// admitAttempt waits, before a handler attempt under ctx's lease, until
// the lease admits it: nil when it may start, errClaimLost when the lease
// was lost meanwhile, else ctx's stop cause. A lease that is no Admitter
// (or none: a consumer without a State) admits every attempt.
func (c *Consumer) admitAttempt(ctx context.Context) error {
	hl, _ := handler.LeaseOf(ctx)
	l, ok := hl.(Lease)
	if !ok {
		return nil
	}
	a, ok := l.(Admitter)
	if !ok {
		return nil
	}
	// The usual case costs no goroutine: a lease that admits at once
	// does so under an ended context too.
	if a.Admit(endedCtx) == nil {
		return nil
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.Lost():
			cancel()
		case <-actx.Done():
		}
	}()
	if err := a.Admit(actx); err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return c.stopCause(ctx)
	}
	// The lease was lost while the attempt waited, or its marker stopped
	// (the lease is gone): the message is looked up under the next lease.
	return errClaimLost
}

// endedCtx is a context that has ended: Admit under it answers without
// waiting.
var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
