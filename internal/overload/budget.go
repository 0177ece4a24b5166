package overload

import (
	"sync"
	"time"
)

// Budget bounds retries to a share of the first calls, as Envoy's retry
// budgets and gRPC's retry throttling do: each first call earns Ratio of
// a retry, each retry spends one, and a floor of MinPerSecond retries a
// second keeps a backlog draining when no first calls are made. A retry
// refused waits and asks again; it is never dropped. The tokens saved are
// capped at Burst, so a calm hour does not buy a storm.
type Budget struct {
	ratio, minPerSec, burst float64
	now                     func() time.Time

	mu     sync.Mutex
	tokens float64
	last   time.Time
	denied uint64
}

// NewBudget returns a Budget (nil: retries are never refused when ratio
// is 0).
func NewBudget(ratio, minPerSecond float64, burst int, now func() time.Time) *Budget {
	if ratio <= 0 {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	b := &Budget{ratio: ratio, minPerSec: minPerSecond, burst: float64(max(burst, 1)), now: now}
	b.tokens = b.burst
	return b
}

// Call records a first call.
func (b *Budget) Call() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens = min(b.tokens+b.ratio, b.burst)
	b.mu.Unlock()
}

// Retry reports whether a retry may be made now, and spends its token if
// so.
func (b *Budget) Retry() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if !b.last.IsZero() {
		b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.minPerSec, b.burst)
	}
	b.last = now
	if b.tokens < 1 {
		b.denied++
		return false
	}
	b.tokens--
	return true
}

// Denied counts the retries refused (each asks again later).
func (b *Budget) Denied() uint64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.denied
}
