// Package overload bounds the calls in flight to one downstream by what it
// can carry. A Limiter holds a concurrency limit that adapts to the
// downstream's latency and timeouts (AIMD: additive increase while the
// latency stays near its baseline, multiplicative decrease when it grows
// past baseline × tolerance or a call times out), and a Budget bounds the
// retries to a share of the first calls. Both are cheap on the path of a
// fast handler: a mutex, two counters and a clock read per call, no
// goroutine, no timer and no allocation unless a caller has to wait.
//
// The design follows TCP congestion control and Netflix's
// concurrency-limits (AIMD and Gradient): a receiver's latency is the
// signal that it queues work, and a client that keeps its in-flight
// calls below the point where latency grows gets the receiver's full
// throughput without building a queue at it.
package overload

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Config is a Limiter's settings.
type Config struct {
	// Initial is the limit before the first measurement.
	Initial int
	// Min and Max bound the limit.
	Min, Max int
	// Tolerance: a window of calls whose shortest call exceeds
	// Tolerance × the baseline means the downstream queues work.
	Tolerance float64
	// Backoff is the factor the limit is multiplied by on congestion.
	Backoff float64
}

// DefaultConfig is the limiter the consumer ships with for max in-flight
// calls.
func DefaultConfig(max int) Config {
	return Config{Initial: min(10, max), Min: 1, Max: max, Tolerance: 1.3, Backoff: 0.75}
}

// Outcome is what a call tells the limiter.
type Outcome int

const (
	// Success: the downstream answered; its latency is a sample.
	Success Outcome = iota
	// Dropped: the call timed out (or the downstream said it is
	// overloaded): the limit decreases.
	Dropped
	// Ignored: the call says nothing of the downstream's load (a fast
	// error, a cancelled call).
	Ignored
)

// minWindow is the fewest samples a window is judged on: fewer are
// noise.
const minWindow = 8

// minEvidence is the fewest samples a cut on latency is made on: windows
// in a row whose shortest calls were all slow, minEvidence calls in all.
// The shortest of fewer is noise: of 8 answers spread over 1–3 s, the
// shortest exceeds 1.3 × the shortest ever seen a quarter of the time,
// so a consumer with a small limit (windows of 8) was cut on the spread
// alone and stayed small while another took the receiver (two consumers
// split it 4:30); of 24, 2%. A timeout cuts at once.
const minEvidence = 24

// noiseFloor is the least a window's shortest call must exceed the
// tolerance by to be slow: below a millisecond a call's latency is the
// scheduler's (a handler that answers in microseconds, on a busy
// machine), not a queue at a receiver, and cutting on it only took
// parallelism from a fast handler.
const noiseFloor = time.Millisecond

// Limiter is an adaptive concurrency limit. The zero value is not usable;
// a nil *Limiter admits everything.
type Limiter struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	limit    float64
	inFlight int
	waiters  []chan struct{} // FIFO; each is closed when handed a slot
	// retrying is how many waiters at the front are retries (AcquireRetry):
	// they go before the first attempts waiting.
	retrying int
	// The current window: samples since the last judgement.
	n    int
	sum  time.Duration
	low  time.Duration // the window's shortest call
	drop bool
	peak int
	// The window's first latencies: their median tells how widely the
	// downstream's answers spread (spreadOf).
	samples [spreadSamples]time.Duration
	ns      int
	opened  time.Time // when the window began (the last judgement)
	since   time.Time // calls started before it belong to an older limit
	// baseline is the latency of the downstream when it does not queue:
	// the shortest call seen, or a longer one that cuts of the limit did
	// not shorten (the downstream became slower; it is not our queue).
	baseline  time.Duration
	cutLow    time.Duration // the shortest call of the window that made the last cut
	stuck     int           // cuts in a row that did not shorten the calls
	slowN     int           // samples of the windows in a row that were slow, not yet cut on
	calm      int           // windows since the last cut
	lastMean  time.Duration
	congested time.Time // when a window was last judged congested
	decreases uint64
}

// New returns a Limiter; now is the clock (time.Now when nil).
func New(cfg Config, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	cfg.Max = max(cfg.Max, 1)
	cfg.Min = min(max(cfg.Min, 1), cfg.Max)
	cfg.Initial = min(max(cfg.Initial, cfg.Min), cfg.Max)
	if cfg.Tolerance <= 1 {
		cfg.Tolerance = 1.3
	}
	if cfg.Backoff <= 0 || cfg.Backoff >= 1 {
		cfg.Backoff = 0.75
	}
	return &Limiter{cfg: cfg, now: now, limit: float64(cfg.Initial), opened: now()}
}

// TryAcquire takes a slot if one is free now and nobody waits for one.
func (l *Limiter) TryAcquire() (time.Time, bool) {
	if l == nil {
		return time.Time{}, true
	}
	l.mu.Lock()
	ok := l.takeLocked()
	l.mu.Unlock()
	if !ok {
		return time.Time{}, false
	}
	return l.now(), true
}

// takeLocked takes a slot if one is free and nobody waits for one (l.mu
// held).
func (l *Limiter) takeLocked() bool {
	if l.inFlight >= int(l.limit) || len(l.waiters) > 0 {
		return false
	}
	l.inFlight++
	l.peak = max(l.peak, l.inFlight)
	return true
}

// Acquire waits for a slot: it returns the call's start time and true, or
// false when ctx ended first. A caller that got a slot must Release it.
func (l *Limiter) Acquire(ctx context.Context) (time.Time, bool) {
	return l.acquire(ctx, false)
}

// AcquireRetry is Acquire for a call's retry: it waits before the first
// calls waiting (after the retries already waiting). A retry's message has
// waited for a slot once already, and its customer's later messages wait
// behind it; at the back of a queue of other customers' first calls it
// waited a whole queue again (a bot answering in 5–30 s whose first
// attempts fail fast 30% of the time: a retry waited half a minute).
// The retries themselves are bounded by the caller's Budget.
func (l *Limiter) AcquireRetry(ctx context.Context) (time.Time, bool) {
	return l.acquire(ctx, true)
}

func (l *Limiter) acquire(ctx context.Context, retry bool) (time.Time, bool) {
	if l == nil {
		return time.Time{}, true
	}
	l.mu.Lock()
	if l.takeLocked() {
		l.mu.Unlock()
		return l.now(), true
	}
	ch := make(chan struct{})
	if retry {
		l.waiters = slices.Insert(l.waiters, l.retrying, ch)
		l.retrying++
	} else {
		l.waiters = append(l.waiters, ch)
	}
	l.mu.Unlock()
	select {
	case <-ch:
		return l.now(), true
	case <-ctx.Done():
		l.mu.Lock()
		for i, w := range l.waiters {
			if w == ch {
				if i < l.retrying {
					l.retrying--
				}
				l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
				l.mu.Unlock()
				return time.Time{}, false
			}
		}
		l.mu.Unlock()
		// Handed a slot as ctx ended: give it on.
		l.Release(time.Time{}, Ignored)
		return time.Time{}, false
	}
}

// Release ends a call that started at start (Acquire's time) with
// outcome o.
func (l *Limiter) Release(start time.Time, o Outcome) {
	if l == nil {
		return
	}
	var rtt time.Duration
	if o == Success {
		rtt = l.now().Sub(start)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	// Samples of calls started before the last decrease measure the
	// queue the old limit built: judging them again would cut twice.
	if !start.IsZero() && !start.Before(l.since) {
		switch o {
		case Success:
			l.n++
			l.sum += rtt
			if l.low == 0 || rtt < l.low {
				l.low = max(rtt, time.Nanosecond)
			}
			if l.ns < spreadSamples {
				l.samples[l.ns] = rtt
				l.ns++
			}
		case Dropped:
			l.drop = true
			l.n++
		}
		if l.n >= max(int(l.limit), minWindow) || (l.drop && l.n >= 1) {
			l.judge()
		}
	}
	l.handOff()
}

// judge ends the window (l.mu held). It compares the window's shortest
// call with the baseline, as TCP Vegas compares round trips with the
// shortest seen: when the downstream queues our calls every call waits,
// the shortest too, while a downstream whose answers merely vary (1–3 s)
// still answers some calls quickly. The mean would mistake that spread
// for a queue, or hide a queue in it.
func (l *Limiter) judge() {
	now := l.now()
	if l.n > 0 && l.sum > 0 {
		l.lastMean = l.sum / time.Duration(l.n)
	}
	low := l.low
	if low > 0 && (l.baseline == 0 || low < l.baseline) {
		l.baseline = low
	}
	// allowed is how far above the baseline the window's shortest call
	// may lie with no queue at the downstream: the tolerance's share of
	// the baseline, or, for answers spread far wider than that, the
	// spread's (spreadOf; the peak bound is argued on the tolerance,
	// PeakBound).
	allowed := max(time.Duration((l.cfg.Tolerance-1)*float64(l.baseline)), noiseFloor)
	if sp := l.spreadOf(low, l.slowN+l.n); 2*sp >= 3*allowed {
		allowed = sp
	}
	slow := low > 0 && low-l.baseline > allowed
	if slow && !l.drop && l.slowN+l.n < minEvidence {
		// Slow, on too few calls to tell a queue from the answers'
		// spread: the next windows decide, on the shortest call and the
		// spread of all of them.
		l.slowN += l.n
		l.n, l.sum, l.peak = 0, 0, l.inFlight
		l.opened = now
		return
	}
	if slow && !l.drop && l.cutLow > 0 && float64(low) >= 0.95*float64(l.cutLow) {
		// The last cut did not shorten the calls. Three times in a row, the
		// downstream did not queue our calls: it became slower (another
		// client's queue would shrink when it cuts too). That is its
		// latency now.
		if l.stuck++; l.stuck >= 3 {
			l.baseline, slow, l.stuck = low, false, 0
		}
	} else if !slow {
		l.stuck = 0
	}
	switch {
	case l.drop || slow:
		l.slowN = 0
		l.limit = math.Max(float64(l.cfg.Min), math.Floor(l.limit*l.cfg.Backoff))
		l.since = now
		l.congested = now
		l.decreases++
		l.cutLow = low
		l.calm = 0
	case 2*l.peak >= int(l.limit):
		// Only a window that used the limit says the downstream can
		// carry more: one more call a round trip (a window of minWindow
		// calls under a smaller limit spans several, and adds one for
		// each, at most doubling it: consumers sharing a receiver grow
		// alike whatever their limits, as TCP flows do, and a limit cut
		// to 1 is back to 8 in three windows, not eight), and more after
		// a long calm (another client of the downstream left, or it got
		// faster), at most a sixth more a window.
		l.slowN = 0
		l.calm++
		perRoundTrip := max(1, min(float64(l.n)/l.limit, l.limit))
		inc := math.Max(perRoundTrip, math.Min(float64(l.calm/6), l.limit/6))
		if span := now.Sub(l.opened); l.peak >= int(l.limit) && low > 0 && 2*(low-l.baseline) < allowed {
			// The whole limit was used and the calls show no sign of a
			// queue (less than half the allowance): the limit grows with
			// the time the window took, as TCP CUBIC grows its window
			// with the time since the last loss rather than per round
			// trip, up to doubling a growthTime. One call a round trip
			// is a rate that shrinks as the round trip grows: a bot
			// answering in 5–30 s took minutes to get the calls its
			// waiting customers needed. A round trip of a few seconds
			// grows by one a window, as before.
			inc = math.Max(inc, math.Min(l.limit*float64(span)/float64(growthTime), l.limit/2))
		}
		l.limit = math.Min(float64(l.cfg.Max), l.limit+inc)
		l.cutLow = 0
	default:
		l.slowN = 0
		l.cutLow = 0
	}
	l.n, l.sum, l.low, l.drop, l.peak, l.ns = 0, 0, 0, false, l.inFlight, 0
	l.opened = now
}

// growthTime is how long a limit whose calls show no queue takes at most
// to double.
const growthTime = time.Minute

// spreadSamples is how many latencies of a window spreadOf reads.
const spreadSamples = 64

// spreadK is how many times its expected spread a window's shortest call
// must exceed the baseline by to be slow.
const spreadK = 4

// spreadOf is how far above the downstream's floor the shortest of n
// calls lies by chance alone, spreadK times over (l.mu held): of n answers
// spread evenly above a floor, the shortest lies about range/(n+1) above
// it, and the range is about twice the median's distance from the
// shortest. A queue delays every call alike, the shortest and the median,
// so their distance — and this allowance — does not grow with a queue: it
// only keeps a downstream whose answers merely spread widely (an LLM bot's
// 5–30 s) from looking congested. For 1–3 s answers in windows of 20 or
// more it is below the tolerance's 30% and changes nothing.
func (l *Limiter) spreadOf(low time.Duration, n int) time.Duration {
	if l.ns < minWindow {
		return 0
	}
	s := l.samples[:l.ns]
	slices.Sort(s)
	gap := s[len(s)/2] - low
	return spreadK * 2 * gap / time.Duration(n+1)
}

// handOff gives free slots to waiters in order (l.mu held).
func (l *Limiter) handOff() {
	for len(l.waiters) > 0 && l.inFlight < int(l.limit) {
		ch := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		if l.retrying > 0 {
			l.retrying--
		}
		l.inFlight++
		l.peak = max(l.peak, l.inFlight)
		close(ch)
	}
}

// Call runs f in a slot under the limit: it waits for one (ctx's error
// when ctx ends first), and tells the limiter what f's error says of the
// downstream: nil, an answer (its latency a sample); overloaded(err), the
// downstream throttled or timed out the call (the limit is cut); any other
// error, nothing. Retries of f are the caller's, each a Call of its own,
// so a throttled downstream gets fewer calls, not more. A nil Limiter
// runs f at once.
func (l *Limiter) Call(ctx context.Context, f func() error, overloaded func(error) bool) error {
	start, ok := l.Acquire(ctx)
	if !ok {
		return ctx.Err()
	}
	err := f()
	o := Success
	switch {
	case err == nil:
	case overloaded != nil && overloaded(err):
		o = Dropped
	default:
		o = Ignored
	}
	l.Release(start, o)
	return err
}

// PeakBound is how many calls consumers Limiters with tolerance let a
// receiver of capacity concurrent calls have at once, at most: its
// capacity, the queue they cannot tell from the spread of its answers
// (a queue delays the shortest call of a window by less than tolerance
// × its no-queue latency up to (tolerance − 1) × capacity calls), and
// one call per consumer grown while a window closes.
// docs/architecture.md ("Overload") argues it; the slow-receiver
// journey and TestTwoLimitersShareTheReceiver hold the limiter to it.
func PeakBound(capacity int, tolerance float64, consumers int) int {
	return int(math.Ceil(float64(capacity)*tolerance)) + consumers
}

// Raise lifts the limit to n (at most Max) when it is lower: a limit the
// downstream carried for another client of it (a consumer restarted in a
// fleet starts where the fleet is, as TCP shares what its connections to
// one host learnt, RFC 9040), not at Initial. The windows judge it from
// there: a limit the downstream cannot carry is cut.
func (l *Limiter) Raise(n int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f := math.Min(float64(n), float64(l.cfg.Max)); f > l.limit {
		l.limit = f
		l.handOff()
	}
}

// Stats is a Limiter's state for metrics and the console.
type Stats struct {
	Limit, InFlight, Waiting int
	// Latency is the last window's mean, Baseline the latency the
	// downstream has when it does not queue (its shortest calls).
	Latency, Baseline time.Duration
	// Congested is when a window last showed the downstream queueing or
	// timing out (zero: never); Decreases counts them.
	Congested time.Time
	Decreases uint64
}

// Stats returns the limiter's state (the zero Stats for nil).
func (l *Limiter) Stats() Stats {
	if l == nil {
		return Stats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Limit: int(l.limit), InFlight: l.inFlight, Waiting: len(l.waiters), Latency: l.lastMean,
		Baseline: l.baseline, Congested: l.congested, Decreases: l.decreases}
}

// SlowWithin reports whether the downstream showed congestion (a timeout,
// or latency past the tolerance) within d of now.
func (l *Limiter) SlowWithin(d time.Duration) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.congested.IsZero() && l.now().Sub(l.congested) <= d
}
