// Package daemon owns what every kfpipe process does the same way: flags,
// config, logger, metrics, the ops server with Kafka and Redis readiness,
// topic bootstrap, and a graceful shutdown on SIGINT/SIGTERM with a
// deadline.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/obs"
	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/version"
)

// Version is this build's version (internal/version, set at build time
// with -ldflags).
var Version = version.Get("").Version

// Librdkafka returns the linked librdkafka's version, for version.Handle.
func Librdkafka() string {
	_, s := kafka.LibraryVersion()
	return s
}

// Flags are the command-line flags every daemon accepts.
type Flags struct {
	Config string
}

// ParseFlags parses the common flags from args (without the program name).
func ParseFlags(name string, args []string) (Flags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var f Flags
	fs.StringVar(&f.Config, "config", "", "config file (YAML); default $KFPIPE_CONFIG")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	f.Config = config.Path(f.Config)
	return f, nil
}

// Base is what Start gives a daemon: its shared clients and the ops server.
type Base struct {
	Name     string
	Log      *zap.Logger
	Registry *prometheus.Registry
	Ops      *obs.Server
	Redis    redis.UniversalClient
	Admin    *kafka.AdminClient
	// Coord is the etcd coordination provider and Fleet this process's
	// entry in the fleet; both nil unless coord.enabled.
	Coord  *coord.Provider
	Fleet  *fleet.Self
	common config.Common
	// etcdDown is the start of the current etcd outage (unix ns; 0: up).
	etcdDown atomic.Int64
	// closers closes what Start built, last built first (Close).
	closers Closers
}

// Start builds the logger, registry, Redis client, Kafka admin client, the
// ops server (with kafka and redis readiness checks) and bootstraps the
// topics. Close releases all of it. /readyz answers 503 "starting" until
// the daemon, its own checks registered and its listeners up, calls
// b.Ops.Started().
func Start(ctx context.Context, name string, c config.Common) (*Base, error) {
	log, err := obs.NewLogger(c.Log, name)
	if err != nil {
		return nil, err
	}
	b := &Base{Name: name, Log: log, Registry: obs.NewRegistryLabels(name, obs.BuildLabels(version.Get(Librdkafka()))), common: c}
	b.closers.AddFunc("logger", func() error { _ = log.Sync(); return nil }) // stderr's sync fails on a terminal
	b.Redis = redisconn.New(c.Redis)
	b.closers.AddFunc("redis", func() error { _ = b.Redis.Close(); return nil })
	redisErrs := redisconn.Instrument(b.Redis, b.Registry)
	b.Admin, err = kafka.NewAdminClient(kafkaclient.Admin(c.Kafka))
	if err != nil {
		_ = b.Close(context.Background())
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	b.closers.AddFunc("kafka admin client", func() error { b.Admin.Close(); return nil })
	b.Ops = obs.NewServer(obs.ServerConfig{Addr: c.Ops.Addr, Pprof: c.Ops.Pprof, ReadyTimeout: c.Ops.ReadyTimeout,
		Starting: true}, b.Registry, log)
	b.Ops.AddCheck("kafka", func(ctx context.Context) error { return kafkaclient.Ping(ctx, b.Admin) })
	b.Ops.AddCheck("redis", redisconn.Ping(b.Redis))
	b.Ops.AddDetail("redis", redisErrs.OOMDetail)
	if err := b.Ops.Start(); err != nil {
		_ = b.Close(context.Background())
		return nil, err
	}
	b.closers.Add("ops server", b.Ops.Shutdown)
	bctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.checkRedisPolicy(bctx); err != nil {
		_ = b.Close(context.Background())
		return nil, err
	}
	if err := b.bootstrapTopics(bctx); err != nil {
		_ = b.Close(context.Background())
		return nil, err
	}
	if err := b.recordPartitionCount(bctx); err != nil {
		_ = b.Close(context.Background())
		return nil, err
	}
	if c.Coord.Enabled {
		if err := b.startCoord(bctx); err != nil {
			_ = b.Close(context.Background())
			return nil, err
		}
	}
	return b, nil
}

// startCoord connects to etcd (retrying while it is not reachable, like the
// topic bootstrap), joins the fleet and starts the pinger behind the
// "etcd" line of /readyz. etcd going away later makes no daemon unready:
// what it coordinates (the fleet, an etcd worker-ID lease) reports its own
// trouble, and everything keeps the last state it saw.
func (b *Base) startCoord(ctx context.Context) error {
	for {
		p, err := coord.New(ctx, b.common.Coord.Config, coord.WithLogger(b.Log), coord.WithRegisterer(b.Registry))
		if err == nil {
			b.Coord = p
			b.closers.AddFunc("coord", func() error {
				if err := p.Close(); err != nil {
					b.Log.Warn("close coord", zap.Error(err))
				}
				return nil
			})
			break
		}
		b.Log.Warn("etcd not reachable yet; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (coord.endpoints=%v)", err, b.common.Coord.Endpoints)
		case <-time.After(time.Second):
		}
	}
	self, err := fleet.Join(ctx, b.Coord, fleet.NewMember(b.Name, Version, b.Ops.Addr()), b.Log)
	if err != nil {
		return err
	}
	b.Fleet = self
	b.closers.Add("fleet", func(ctx context.Context) error {
		if err := self.Leave(ctx); err != nil {
			b.Log.Warn("leave the fleet", zap.Error(err))
		}
		return nil
	})
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kfpipe_coord_reachable",
		Help: "1 while etcd (coord.endpoints) answered the last ping (every 5 s), 0 while it does not."})
	b.Registry.MustRegister(up)
	up.Set(1)
	pctx, stop := context.WithCancel(context.Background())
	pingDone := make(chan struct{})
	go b.pingEtcd(pctx, up, pingDone)
	b.closers.AddFunc("etcd pinger", func() error { stop(); <-pingDone; return nil })
	b.Ops.AddDetail("etcd", func() string {
		since := b.etcdDown.Load()
		if since == 0 {
			return ""
		}
		return fmt.Sprintf("degraded: etcd unreachable for %s; the fleet entry and anything else coordinated through etcd keep their last state",
			time.Since(time.Unix(0, since)).Round(time.Second))
	})
	return nil
}

// pingEtcd pings etcd every 5 s until ctx ends, then closes done.
func (b *Base) pingEtcd(ctx context.Context, up prometheus.Gauge, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := b.Coord.Ping(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if b.etcdDown.Swap(0) != 0 {
				b.Log.Info("etcd reachable again")
			}
			up.Set(1)
		default:
			if b.etcdDown.CompareAndSwap(0, time.Now().UnixNano()) {
				b.Log.Warn("etcd unreachable: running on the last coordinated state", zap.Error(err))
			}
			up.Set(0)
		}
	}
}

// bootstrapTopics retries while the broker is not yet reachable (a daemon
// may start before Kafka in a fresh deployment), but not on a mismatch.
func (b *Base) bootstrapTopics(ctx context.Context) error {
	for {
		err := kafkaclient.Bootstrap(ctx, b.Admin, b.common.Kafka.Topics.Main, b.common.Kafka.Topics.DLQ)
		if err == nil || errors.Is(err, kafkaclient.ErrPartitionMismatch) {
			return err
		}
		b.Log.Warn("topic bootstrap failed; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (kafka.brokers=%s)", err, b.common.Kafka.Brokers)
		case <-time.After(time.Second):
		}
	}
}

// recordPartitionCount records the main topic's partition count in the
// dedup state's count history and, when the count is new (partitions were
// added), waits until every consumer's cached history holds it, before
// this daemon places (kf-producer, the dlq-consumer's re-injections) or
// reads a message under it: a copy of a moved user's message is then
// always looked for in the partition the user had (state.RecordPartitionCount).
func (b *Base) recordPartitionCount(ctx context.Context) error {
	main := b.common.Kafka.Topics.Main
	wait, err := state.RecordPartitionCount(ctx, b.Redis, b.common.Redis.KeyPrefix, main.Name, main.Partitions)
	if err != nil {
		return err
	}
	if wait > 0 {
		b.Log.Info("the main topic's partition count is new: waiting until every consumer's dedup state knows it",
			zap.String("topic", main.Name), zap.Int("partitions", main.Partitions), zap.Duration("wait", wait))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	return nil
}

// checkRedisPolicy refuses to start on a Redis that may evict kfpipe's
// keys (redisconn.CheckEvictionPolicy), retrying while Redis is not yet
// reachable, like the topic bootstrap. redis.skip_eviction_policy_check
// skips it, loudly.
func (b *Base) checkRedisPolicy(ctx context.Context) error {
	if b.common.Redis.SkipEvictionPolicyCheck {
		b.Log.Warn("redis.skip_eviction_policy_check is set: Redis's maxmemory-policy is NOT checked; " +
			"a policy that evicts keys (allkeys-*, volatile-*) repeats effects and loses cursors")
		return nil
	}
	for {
		policy, err := redisconn.CheckEvictionPolicy(ctx, b.Redis)
		if err == nil {
			b.Log.Info("redis eviction policy", zap.String("maxmemory_policy", policy))
			return nil
		}
		if errors.Is(err, redisconn.ErrEvictionPolicy) {
			return err
		}
		b.Log.Warn("reading Redis's maxmemory-policy failed; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis: cannot read maxmemory-policy: %w", err)
		case <-time.After(time.Second):
		}
	}
}

// Close releases what Start built, last built first: the etcd pinger,
// the fleet entry and etcd client (their errors logged, not returned), the
// ops server, the Kafka admin and Redis clients, the logger's buffer.
func (b *Base) Close(ctx context.Context) error { return b.closers.Close(ctx) }

// SignalContext returns a context cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Failed reports whether err is a real failure, as opposed to a shutdown
// requested by a signal while the daemon was still starting.
func Failed(ctx context.Context, err error) bool {
	if err == nil {
		return false
	}
	return ctx.Err() == nil || !errors.Is(err, context.Canceled)
}
