package once

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// extender keeps a claim alive while f runs by extending it every lease/3.
// It is a timer rather than a goroutine so that the common case — f returns
// well within a third of the lease — costs no goroutine and no Redis call.
// The call that started it owns it: stop waits for a running extension.
type extender struct {
	c      *Client
	key    string
	rkey   string
	claim  string
	cancel context.CancelCauseFunc // cancels f's context when the claim is lost

	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	running sync.WaitGroup // one per armed timer whose callback may still run
}

func startExtender(c *Client, key, rkey, claim string, cancel context.CancelCauseFunc) *extender {
	e := &extender{c: c, key: key, rkey: rkey, claim: claim, cancel: cancel}
	e.mu.Lock()
	e.arm(c.lease / 3)
	e.mu.Unlock()
	return e
}

// arm schedules the next extension in d; e.mu is held.
func (e *extender) arm(d time.Duration) {
	e.running.Add(1)
	e.timer = time.AfterFunc(d, e.fire)
}

func (e *extender) fire() {
	defer e.running.Done()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	// Bounded by a third of the lease: a slower answer is as good as none.
	ctx, cancel := context.WithTimeout(context.Background(), e.c.lease/3)
	v, err := extendScript.Run(ctx, e.c.rdb, []string{e.rkey}, e.claim, e.c.leaseMs).Int64()
	cancel()
	next := e.c.lease / 3
	switch {
	case err != nil:
		// Transient: try again soon, well before the claim can expire; if
		// Redis stays away the claim expires, and finishScript reports that.
		next = e.c.lease / 12
		e.c.log.Warn("once: extend claim", zap.String("key", e.key), zap.Error(err))
	case v == 0:
		e.c.log.Warn("once: claim lost while f runs", zap.String("key", e.key))
		e.cancel(ErrLeaseLost)
		return
	}
	e.arm(next)
}

// stop cancels future extensions and waits for one in progress. It may be
// called more than once.
func (e *extender) stop() {
	e.mu.Lock()
	if !e.stopped {
		e.stopped = true
		if e.timer.Stop() {
			e.running.Done() // its callback will never run
		}
	}
	e.mu.Unlock()
	e.running.Wait()
}
