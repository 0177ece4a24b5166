package once

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Config configures a Client. Zero fields take the defaults documented on
// each field.
type Config struct {
	// Client is the Redis client to use (single node or Sentinel, chosen by
	// the caller). It is not closed by Client.Close. When nil, Addr is used.
	Client redis.UniversalClient
	// Addr is a single Redis node address ("host:port"), used only when
	// Client is nil; that client is owned and closed by Client.Close.
	Addr string
	// KeyPrefix is prepended to every key (e.g. "kfpipe:").
	KeyPrefix string
	// Lease is how long a "processing" claim lives without extension; while
	// f runs (and until its done mark is written) the client's keeper renews
	// it every quarter of the lease, and gives it up — f is stopped — when
	// no renewal has succeeded for two thirds of it. A claimer that crashes
	// blocks its key for at most Lease, so it bounds how long a crashed
	// consumer's users wait. Default 10s.
	Lease time.Duration
	// PollInterval is how often a caller waiting on someone else's claim
	// looks again. Default 20ms.
	PollInterval time.Duration
	// OpTimeout bounds the Redis calls made after f returned (finish,
	// release) and every pipeline of the batcher; they run even when the
	// caller's context is already done, so the outcome of f is recorded.
	// Default 3s.
	OpTimeout time.Duration
	// Batch coalesces the Redis operations of concurrent calls into
	// pipelines.
	Batch BatchConfig
}

// BatchConfig configures the pipelining of claim, finish and release
// operations. One call costs two operations (claim, finish); without
// batching each is a round trip of its own, which caps a consumer that
// dedups every message near 25k msg/s (BENCHMARKS.md).
type BatchConfig struct {
	// Enabled turns batching on.
	Enabled bool
	// FlushInterval is how long a batch may wait for more operations before
	// it is sent while another pipeline is in flight (with every pipeline
	// idle a batch is sent at once). 0 (the default) sends a batch as soon
	// as a pipeline is free: operations only queue up while all pipelines
	// are busy, so an idle client adds no latency and a loaded one batches
	// by itself.
	FlushInterval time.Duration
	// MaxBatch is the most operations in one pipeline. Default 256.
	MaxBatch int
	// Pipelines is how many pipelines may be in flight at once. Default 4.
	Pipelines int
}

func (c *Config) setDefaults() {
	if c.Lease == 0 {
		c.Lease = 10 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 3 * time.Second
	}
	if c.Batch.MaxBatch == 0 {
		c.Batch.MaxBatch = 256
	}
	if c.Batch.Pipelines == 0 {
		c.Batch.Pipelines = 4
	}
}

// Bounds of the settings a daemon's configuration maps onto (dedup.lease,
// processor.pipeline_flush, processor.pipeline_max_batched): the one
// definition, which internal/config's validation uses too.
const (
	MinLease         = 30 * time.Millisecond
	MaxLease         = 24 * time.Hour
	MaxFlushInterval = 100 * time.Millisecond
	MaxBatchLimit    = 10000
)

// Validate checks the configuration after defaults were applied and names
// the offending key.
func (c Config) Validate() error {
	if c.Client == nil && c.Addr == "" {
		return fmt.Errorf("once.addr is empty and no client was given")
	}
	durations := []struct {
		name     string
		v, lo, h time.Duration
	}{
		{"once.lease", c.Lease, MinLease, MaxLease},
		{"once.poll_interval", c.PollInterval, time.Millisecond, time.Minute},
		{"once.op_timeout", c.OpTimeout, time.Millisecond, time.Minute},
		{"once.batch.flush_interval", c.Batch.FlushInterval, 0, MaxFlushInterval},
	}
	for _, d := range durations {
		if d.v < d.lo {
			return fmt.Errorf("%s %v is smaller than allowed %v", d.name, d.v, d.lo)
		}
		if d.v > d.h {
			return fmt.Errorf("%s %v is larger than allowed %v", d.name, d.v, d.h)
		}
	}
	ints := []struct {
		name     string
		v, lo, h int
	}{
		{"once.batch.max_batch", c.Batch.MaxBatch, 1, MaxBatchLimit},
		{"once.batch.pipelines", c.Batch.Pipelines, 1, 64},
	}
	for _, n := range ints {
		if n.v < n.lo {
			return fmt.Errorf("%s %d is smaller than allowed %d", n.name, n.v, n.lo)
		}
		if n.v > n.h {
			return fmt.Errorf("%s %d is larger than allowed %d", n.name, n.v, n.h)
		}
	}
	return nil
}

type options struct {
	log *zap.Logger
	reg prometheus.Registerer
	// scriptClaim forces the Lua claim (as on Redis < 7.0); tests use it to
	// cover that path on a newer server.
	scriptClaim bool
}

// Option changes how New builds a Client.
type Option func(*options)

// applyOptions returns opts applied to the defaults (a no-op logger).
func applyOptions(opts []Option) options {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	return o
}

// WithLogger sets the logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithRegisterer registers the client's metrics (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.reg = r } }
