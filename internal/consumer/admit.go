package consumer

import (
	"context"
)

// Admitter is implemented by a Lease whose done marks bound the
// effect→mark window by backpressure (the state store's: issue 43): Admit
// returns when the partition may start another handler attempt, and
// waits while the partition's marks are unwritten for longer than a small
// bound or cannot be written at all.
type Admitter interface {
	Admit(ctx context.Context) error
}

// endedCtx is a context that has ended: Admit under it answers without
// waiting.
var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
