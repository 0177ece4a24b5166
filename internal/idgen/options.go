package idgen

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/kfpipe/kfpipe/internal/obs"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Clock is the time source of a Generator. Sleep is how the generator waits
// (for the next millisecond, or for a clock that stepped back to catch up);
// a fake clock advances its own time in Sleep so tests are exact and fast.
// A Clock that also has a UnixNano() int64 method is read through it on the
// hot path (SystemClock does, to avoid building a time.Time per ID).
type Clock = clock.SleepClock

// SystemClock is the wall clock, read cheaply. time.Now reads two clocks
// (wall and monotonic); time.Since one. Next is bounded by its clock read,
// so SystemClock reads the monotonic clock against a wall-clock anchor and
// re-reads the wall clock every resyncEvery: a step of the wall clock (NTP
// step, manual change) reaches the rollback tiers within that time, and
// between steps the two clocks advance at the same (NTP-slewed) rate.
//
// Its Sleep spins (yielding the processor) for waits up to spinLimit,
// because the runtime's timers wake up to a millisecond late and a
// generator waiting for the next millisecond would otherwise lose a large
// share of its 4,096 IDs per millisecond.
//
// The zero value is ready to use; use it by pointer.
type SystemClock struct {
	anchor atomic.Pointer[clockAnchor]
}

type clockAnchor struct {
	mono   time.Time // a time.Now reading: carries the monotonic clock
	wallNs int64     // its wall time, Unix nanoseconds
}

const (
	resyncEvery   = 10 * time.Millisecond
	maxAnchorSkew = 20 * time.Microsecond
	spinLimit     = 2 * time.Millisecond
	spinYield     = 64
)

// Now returns the current wall time.
func (c *SystemClock) Now() time.Time { return time.Unix(0, c.UnixNano()) }

// UnixNano returns the current wall time in Unix nanoseconds. Generator
// detects this method and calls it instead of Now on its hot path.
func (c *SystemClock) UnixNano() int64 {
	if a := c.anchor.Load(); a != nil {
		if el := time.Since(a.mono); el < resyncEvery {
			return a.wallNs + int64(el)
		}
	}
	a := newAnchor()
	// Concurrent resyncs may store in either order; every anchor is a
	// correct (wall, monotonic) pair, so the older one is merely older.
	c.anchor.Store(a)
	return a.wallNs + int64(time.Since(a.mono))
}

// newAnchor pairs a wall reading with a monotonic one. time.Now reads the
// wall clock first and the monotonic clock second; if the thread is
// descheduled in between, the pair is off by the gap and the clock would
// jump back by it at the next resync. Bracketing the call with monotonic
// reads bounds that error to maxAnchorSkew.
func newAnchor() *clockAnchor {
	for i := 0; ; i++ {
		before := time.Now()
		now := time.Now()
		if now.Sub(before) <= maxAnchorSkew || i == 9 {
			// After ten tries (a machine that busy) take what we have: the
			// rollback tiers absorb the skew.
			return &clockAnchor{mono: now, wallNs: now.UnixNano()}
		}
	}
}

// Sleep waits for d. Short waits spin, yielding every spinYield rounds so
// other goroutines on this P are delayed by microseconds, not the whole wait.
func (c *SystemClock) Sleep(d time.Duration) {
	if d > spinLimit {
		time.Sleep(d)
		return
	}
	start := time.Now()
	for i := 1; time.Since(start) < d; i++ {
		if i%spinYield == 0 {
			runtime.Gosched()
		}
	}
}

// unixNanoClock is the optional fast path of a Clock.
type unixNanoClock interface {
	UnixNano() int64
}

// Option customises a Generator, an allocator or a Sequencer; options that
// do not apply to a constructor are ignored by it.
type Option func(*options)

type options struct {
	clock  Clock
	reg    prometheus.Registerer
	logger *zap.Logger
}

func buildOptions(opts []Option) options {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.clock == nil {
		o.clock = &SystemClock{}
	}
	if o.logger == nil {
		o.logger = zap.NewNop()
	}
	return o
}

// WithClock sets the Generator's clock (default a new SystemClock).
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithRegisterer registers the package's kfpipe_idgen_* metrics on reg;
// without it nothing is registered.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.logger = l } }

// Metric label values of kfpipe_idgen_errors_total and kfpipe_idgen_waits_total.
const (
	reasonClockBackwards    = "clock_backwards"
	reasonClockOutOfRange   = "clock_out_of_range"
	reasonSequenceExhausted = "sequence_exhausted"
	reasonKeyStolen         = "key_stolen"
	reasonLeaseExpired      = "lease_expired"
	reasonRenew             = "renew"
	reasonRedis             = "redis"
)

type metrics struct {
	errors    *prometheus.CounterVec
	waits     *prometheus.CounterVec
	sequences prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_idgen_errors_total",
			Help: "ID generation failures by reason (clock_backwards, clock_out_of_range, key_stolen, lease_expired, renew, redis).",
		}, []string{"reason"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_idgen_waits_total",
			Help: "Times a Snowflake generator waited for its clock, by reason (sequence_exhausted, clock_backwards).",
		}, []string{"reason"}),
		sequences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_idgen_sequence_generated_total",
			Help: "Sequence values handed out by Sequencer.Next and NextBatch.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	// Several generators or allocators may share one registry: reuse the
	// collectors that are already there.
	var err error
	if m.errors, err = obs.RegisterShared(reg, m.errors); err != nil {
		return nil, err
	}
	if m.waits, err = obs.RegisterShared(reg, m.waits); err != nil {
		return nil, err
	}
	if m.sequences, err = obs.RegisterShared(reg, m.sequences); err != nil {
		return nil, err
	}
	return m, nil
}
