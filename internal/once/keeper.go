package once

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// keeper keeps the claims of running calls alive and gives up the ones it
// cannot keep. One goroutine per Client ticks every twelfth of the lease:
//
//   - A claim whose last successful renewal (or the claim itself) was sent
//     a quarter of the lease ago is renewed; all due claims share one
//     pipeline, sent on a goroutine of its own so that a Redis that does
//     not answer cannot hold up the tick.
//   - A claim whose last successful renewal was sent two thirds of the
//     lease ago or more is treated as lost, whatever Redis says later: its
//     call is told (f's context is cancelled, or Hooks.Lost) a twelfth of
//     the lease at the latest before Redis can let the claim expire and
//     someone else take the key. Without this, an owner cut off from Redis
//     would go on running f after its claim had expired and another owner
//     had started the same effect (I3).
//
// A call costs a registration under a mutex — no timer, no goroutine and
// no Redis command unless f outlives a quarter of the lease — which is what
// the consumer's hot path needs: most calls end within microseconds. A
// call stays registered until its done mark is acknowledged, so a slow mark
// cannot let the claim expire after f succeeded.
type keeper struct {
	c      *Client
	tick   time.Duration
	renewE time.Duration // renew a claim this long after its last renewal
	giveUp time.Duration // treat it as lost this long after its last renewal

	mu       sync.Mutex
	calls    held // sentinel of the circular list of running calls
	inFlight bool // a renewal pipeline is being sent
	lastWarn time.Time
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// held is one running call's claim.
type held struct {
	key, rkey, claim string
	lastOK           time.Time   // when the last successful renewal (or the claim) was sent
	due              time.Time   // when to renew next
	told             bool        // lost was called
	lost             func(error) // told once when the claim is lost
	prev, next       *held       // nil once the call ended
}

func newKeeper(c *Client) *keeper {
	k := &keeper{
		c:      c,
		tick:   max(c.lease/12, time.Millisecond),
		renewE: c.lease / 4,
		giveUp: c.lease * 2 / 3,
		stop:   make(chan struct{}),
	}
	k.calls.prev, k.calls.next = &k.calls, &k.calls
	k.wg.Add(1)
	go k.run()
	return k
}

// add registers a call that now runs f under claim, which was set or last
// renewed by a command sent at claimedAt; lost is called (at most once,
// from the keeper's goroutines, never after remove returned) when the claim
// is lost or can no longer be trusted.
func (k *keeper) add(key, rkey, claim string, claimedAt time.Time, lost func(error)) *held {
	h := &held{key: key, rkey: rkey, claim: claim, lost: lost, lastOK: claimedAt, due: claimedAt.Add(k.renewE)}
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
			k.check(now)
			k.reportWaits(now)
		}
	}
}

// check gives up the claims that went too long without a successful
// renewal and starts a renewal of the due ones unless one is in flight.
func (k *keeper) check(now time.Time) {
	var due []*held
	var cmds [][]any
	k.mu.Lock()
	for h := k.calls.next; h != &k.calls; h = h.next {
		if h.told {
			continue
		}
		if now.Sub(h.lastOK) >= k.giveUp {
			k.loseLocked(h, "once: claim not renewed for most of its lease (Redis unreachable or slow); giving it up")
			continue
		}
		if !k.inFlight && !now.Before(h.due) {
			due = append(due, h)
			cmds = append(cmds, []any{"evalsha", extendScript.Hash(), 1, h.rkey, h.claim, k.c.leaseMs})
		}
	}
	if len(due) > 0 {
		k.inFlight = true
	}
	k.mu.Unlock()
	if len(due) == 0 {
		return
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		k.renew(now, due, cmds)
	}()
}

// loseLocked tells h's call that its claim is lost (k.mu held).
func (k *keeper) loseLocked(h *held, msg string) {
	h.told = true
	k.c.m.leaseLost.Inc()
	k.c.log.Warn(msg, zap.String("key", h.key), zap.Duration("since_renewed", time.Since(h.lastOK)))
	h.lost(ErrLeaseLost)
}

// renew extends the claims of due, in one pipeline sent at sent.
func (k *keeper) renew(sent time.Time, due []*held, cmds [][]any) {
	scripts := make([]*redis.Script, len(due))
	for i := range scripts {
		scripts[i] = extendScript
	}
	res := make([]any, len(due))
	errs := make([]error, len(due))
	// An answer later than the give-up point is as good as none; the tick
	// gives the claims up meanwhile if it comes to that.
	ctx, cancel := context.WithTimeout(context.Background(), k.giveUp-k.renewE)
	defer cancel()
	if k.c.b != nil {
		k.c.b.doAll(ctx, scripts, cmds, res, errs)
	} else {
		k.c.pipelineAll(ctx, scripts, cmds, res, errs)
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight = false
	for i, h := range due {
		if h.next == nil || h.told {
			continue // the call ended, or was told, meanwhile
		}
		switch v, _ := res[i].(int64); {
		case errs[i] != nil:
			// Transient: try again soon; check gives the claim up if no
			// renewal succeeds before the give-up point.
			h.due = now.Add(k.tick)
			k.c.log.Warn("once: extend claim", zap.String("key", h.key), zap.Error(errs[i]))
		case v == 0:
			k.loseLocked(h, "once: claim lost while f runs")
		default:
			h.lastOK = sent
			h.due = sent.Add(k.renewE)
		}
	}
}

// waitReportAfter is how long a call must have waited on someone else's
// claim before the keeper logs the waits (once per waitReportEvery).
const (
	waitReportAfter = 5 * time.Second
	waitReportEvery = 10 * time.Second
)

// reportWaits logs the calls waiting on claims held by others when the
// oldest has waited longer than waitReportAfter: after a crash, the dead
// owner's claims hold its users until their lease expires, and an operator
// must be able to see that rather than a silent stall.
func (k *keeper) reportWaits(now time.Time) {
	if reportWaits(k.c.log, &k.lastWarn, k.c.waits.snapshot(now), now, k.c.lease) {
		k.lastWarn = now
	}
}

// reportWaits logs w (once per waitReportEvery after *last) when its oldest
// wait is longer than waitReportAfter, and says whether it did; both dedup
// stores use it (store claims: claims, store leases: user leases), so
// docs/operations.md's takeover log line is the same for both.
func reportWaits(log *zap.Logger, last *time.Time, w Waits, now time.Time, lease time.Duration) bool {
	if now.Sub(*last) < waitReportEvery || w.Oldest < waitReportAfter {
		return false
	}
	log.Warn("once: waiting on claims held by others (a crashed owner's claims are waited on until their lease expires)",
		zap.Int("waiting", w.Count), zap.Duration("oldest_wait", w.Oldest), zap.String("oldest_key", w.OldestKey),
		zap.Duration("lease", lease))
	return true
}
