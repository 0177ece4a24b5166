package dlq

import (
	"errors"

	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Clock is the time source; tests inject a manual one.
type Clock = clock.Clock

// SystemClock is the wall clock.
var SystemClock Clock = clock.System

// Option configures a Producer, Consumer, Index or Scheduler. An option
// that does not apply to a constructor is ignored by it.
type Option func(*options)

type options struct {
	log        *zap.Logger
	reg        prometheus.Registerer
	clock      Clock
	blocks     BlockLookup
	events     EventSink
	letters    Letters
	maxEntries int64
}

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithRegisterer registers the metrics with r (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.reg = r } }

// WithClock sets the clock (default: wall clock).
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithBlockLookup lets user_blocked retries wait until the block ends.
func WithBlockLookup(b BlockLookup) Option { return func(o *options) { o.blocks = b } }

// WithEventSink makes the scheduler record sent retries, and the index
// purged entries, in the DLQ topic (normally the DLQ Producer), so that
// Rebuild neither sends them again nor brings them back.
func WithEventSink(s EventSink) Option { return func(o *options) { o.events = s } }

// WithMaxEntries bounds the index (dlq_index.max_entries): a new dead
// letter beyond it is refused with IndexFull, and the DLQ consumer holds
// it in the topic until expiry or a purge makes room. 0: unbounded.
func WithMaxEntries(n int64) Option { return func(o *options) { o.maxEntries = n } }

func buildOptions(opts []Option) options {
	o := options{log: zap.NewNop(), clock: SystemClock}
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	if o.clock == nil {
		o.clock = SystemClock
	}
	return o
}

// register registers c with reg, reusing an equal collector registered
// before (two producers in one process share their counters).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
