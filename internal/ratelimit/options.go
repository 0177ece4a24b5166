package ratelimit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/kfpipe/kfpipe/internal/coord"
)

// Clock is the time source for everything whose behaviour depends on time
// (block ends, breaker timeouts, listing of live blocks), so tests are exact.
type Clock = clock.Clock

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Option configures a Limiter, an Admin or a Breakers registry.
type Option func(*options)

type options struct {
	clock   Clock
	logger  *zap.Logger
	reg     prometheus.Registerer
	timeout time.Duration
	etcd    *coord.ConfigCenter
}

func buildOptions(opts []Option) options {
	o := options{clock: SystemClock{}, logger: zap.NewNop(), timeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithClock sets the clock (default SystemClock).
func WithClock(c Clock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithRegisterer registers the metrics on r (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option {
	return func(o *options) { o.reg = r }
}

// WithRedisTimeout bounds each Redis call the package makes on its own
// behalf (loads, block writes, rule reloads); default 5s.
func WithRedisTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithEtcdRules keeps the rules override and the per-user group
// assignments in etcd's config center (rate_limit.rules_backend: etcd)
// instead of Redis: limiters follow them with a watch, and the Admin writes
// them there (the rules by compare-and-set). Blocks stay in Redis.
func WithEtcdRules(cc *coord.ConfigCenter) Option {
	return func(o *options) { o.etcd = cc }
}
