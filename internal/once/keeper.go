package once

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// keeper keeps the claims of running calls alive: one goroutine per Client
// renews, in one pipeline, every claim whose f has run for a third of the
// lease since its claim was last renewed, and tells a call whose claim was
// lost. A call costs a registration under a mutex — no timer, no goroutine
// and no Redis command unless f outlives a third of the lease — which is
// what the consumer's hot path needs: most calls end within microseconds.
type keeper struct {
	c    *Client
	tick time.Duration

	mu    sync.Mutex
	calls held // sentinel of the circular list of running calls
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

// held is one running call's claim.
type held struct {
	key, rkey, claim string
	due              time.Time   // when to renew next
	lost             func(error) // told once when the claim is lost
	prev, next       *held       // nil once the call ended
}

func newKeeper(c *Client) *keeper {
	k := &keeper{c: c, tick: max(c.lease/6, time.Millisecond), stop: make(chan struct{})}
	k.calls.prev, k.calls.next = &k.calls, &k.calls
	k.wg.Add(1)
	go k.run()
	return k
}

// add registers a call that now runs f under claim; lost is called (at
// most once, from the keeper's goroutine, before remove returns) when the
// claim is found lost.
func (k *keeper) add(key, rkey, claim string, lost func(error)) *held {
	h := &held{key: key, rkey: rkey, claim: claim, lost: lost, due: time.Now().Add(k.c.lease / 3)}
	k.mu.Lock()
	h.prev, h.next = k.calls.prev, &k.calls
	k.calls.prev.next = h
	k.calls.prev = h
	k.mu.Unlock()
	return h
}

// remove ends h's call: its claim is no longer renewed and lost is not
// called after remove returns.
func (k *keeper) remove(h *held) {
	k.mu.Lock()
	if h.next != nil {
		h.prev.next, h.next.prev = h.next, h.prev
		h.prev, h.next = nil, nil
	}
	k.mu.Unlock()
}

func (k *keeper) close() {
	k.once.Do(func() { close(k.stop) })
	k.wg.Wait()
}

func (k *keeper) run() {
	defer k.wg.Done()
	t := time.NewTicker(k.tick)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case now := <-t.C:
			k.renew(now)
		}
	}
}

// renew extends the claims that are due, in one pipeline.
func (k *keeper) renew(now time.Time) {
	var due []*held
	var cmds [][]any
	k.mu.Lock()
	for h := k.calls.next; h != &k.calls; h = h.next {
		if now.Before(h.due) {
			continue
		}
		h.due = now.Add(k.c.lease / 3)
		due = append(due, h)
		cmds = append(cmds, []any{"evalsha", extendScript.Hash(), 1, h.rkey, h.claim, k.c.leaseMs})
	}
	k.mu.Unlock()
	if len(due) == 0 {
		return
	}
	scripts := make([]*redis.Script, len(due))
	for i := range scripts {
		scripts[i] = extendScript
	}
	res := make([]any, len(due))
	errs := make([]error, len(due))
	// Bounded by a third of the lease: a slower answer is as good as none.
	ctx, cancel := context.WithTimeout(context.Background(), k.c.lease/3)
	defer cancel()
	if k.c.b != nil {
		k.c.b.doAll(ctx, scripts, cmds, res, errs)
	} else {
		k.c.pipelineAll(ctx, scripts, cmds, res, errs)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, h := range due {
		if h.next == nil {
			continue // the call ended meanwhile
		}
		switch v, _ := res[i].(int64); {
		case errs[i] != nil:
			// Transient: try again soon, well before the claim can expire;
			// if Redis stays away the claim expires, and the done mark
			// reports that.
			h.due = now.Add(k.c.lease / 12)
			k.c.log.Warn("once: extend claim", zap.String("key", h.key), zap.Error(errs[i]))
		case v == 0:
			k.c.log.Warn("once: claim lost while f runs", zap.String("key", h.key))
			h.due = now.Add(100 * 365 * 24 * time.Hour) // told once
			h.lost(ErrLeaseLost)
		}
	}
}
