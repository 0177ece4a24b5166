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
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/obs"
	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// Version is set at build time with -ldflags.
var Version = "dev"

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
	common   config.Common
}

// Start builds the logger, registry, Redis client, Kafka admin client, the
// ops server (with kafka and redis readiness checks) and bootstraps the
// topics. Close releases all of it.
func Start(ctx context.Context, name string, c config.Common) (*Base, error) {
	log, err := obs.NewLogger(c.Log, name)
	if err != nil {
		return nil, err
	}
	b := &Base{Name: name, Log: log, Registry: obs.NewRegistry(name, Version), common: c}
	b.Redis = redisconn.New(c.Redis)
	redisErrs := redisconn.Instrument(b.Redis, b.Registry)
	b.Admin, err = kafka.NewAdminClient(kafkaclient.Admin(c.Kafka))
	if err != nil {
		_ = b.Redis.Close()
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	b.Ops = obs.NewServer(obs.ServerConfig{Addr: c.Ops.Addr, Pprof: c.Ops.Pprof, ReadyTimeout: c.Ops.ReadyTimeout}, b.Registry, log)
	b.Ops.AddCheck("kafka", func(ctx context.Context) error { return kafkaclient.Ping(ctx, b.Admin) })
	b.Ops.AddCheck("redis", redisconn.Ping(b.Redis))
	b.Ops.AddDetail("redis", redisErrs.OOMDetail)
	if err := b.Ops.Start(); err != nil {
		b.closeClients()
		return nil, err
	}
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
	return b, nil
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

func (b *Base) closeClients() {
	b.Admin.Close()
	_ = b.Redis.Close()
}

// Close stops the ops server and closes the shared clients.
func (b *Base) Close(ctx context.Context) error {
	err := b.Ops.Shutdown(ctx)
	b.closeClients()
	_ = b.Log.Sync()
	return err
}

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
