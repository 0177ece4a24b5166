package service

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/handler"
)

type closer interface {
	Close(ctx context.Context) error
}

// run is every daemon's life: flags, config (refusing to start on a bad
// key), the shared base, the daemon's own parts; then, on SIGINT/SIGTERM,
// a graceful shutdown bounded by ops.shutdown_timeout.
func run[C any](ctx context.Context, name string, args []string, load func(string) (*C, error),
	common func(*C) config.Common, start func(context.Context, *C, *daemon.Base) (closer, error)) error {
	flags, err := daemon.ParseFlags(name, args)
	if err != nil {
		return err
	}
	cfg, err := load(flags.Config)
	if err != nil {
		return err
	}
	c := common(cfg)
	base, err := daemon.Start(ctx, name, c)
	if err != nil {
		return err
	}
	svc, err := start(ctx, cfg, base)
	if err != nil {
		_ = base.Close(context.Background())
		return err
	}
	// Every check is registered and every listener up: /readyz may
	// answer from the checks now (503 "starting" until here).
	base.Ops.Started()
	<-ctx.Done()
	base.Log.Info("shutting down", zap.Duration("deadline", c.Ops.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), c.Ops.ShutdownTimeout)
	defer cancel()
	return errors.Join(svc.Close(sctx), base.Close(sctx))
}

// RunProducer runs kf-producer until ctx is cancelled.
func RunProducer(ctx context.Context, args []string) error {
	return run(ctx, "kf-producer", args, config.LoadProducer,
		func(c *config.Producer) config.Common { return c.Common },
		func(ctx context.Context, c *config.Producer, b *daemon.Base) (closer, error) {
			return StartProducer(ctx, c, b)
		})
}

// RunConsumer runs schedule-consumer with the configured handler until ctx
// is cancelled.
func RunConsumer(ctx context.Context, args []string) error {
	return RunConsumerWith(ctx, args, nil)
}

// HandlerFactory builds the consumer's handler once the configuration is
// loaded and the shared clients are up; close (may be nil) runs after the
// consumer stopped.
type HandlerFactory func(ctx context.Context, cfg *config.Consumer, base *daemon.Base) (h handler.Handler, close func(), err error)

// RunConsumerWith is RunConsumer with the handler mk builds (nil: the one
// handler.type names). The public kfpipe.RunConsumer is built on it.
func RunConsumerWith(ctx context.Context, args []string, mk HandlerFactory) error {
	return run(ctx, "schedule-consumer", args, config.LoadConsumer,
		func(c *config.Consumer) config.Common { return c.Common },
		func(ctx context.Context, c *config.Consumer, b *daemon.Base) (closer, error) {
			var h handler.Handler
			var done func()
			if mk != nil {
				var err error
				if h, done, err = mk(ctx, c, b); err != nil {
					return nil, err
				}
			}
			s, err := StartConsumer(ctx, c, b, h)
			if err != nil {
				if done != nil {
					done()
				}
				return nil, err
			}
			return closerFunc(func(ctx context.Context) error {
				err := s.Close(ctx)
				if done != nil {
					done()
				}
				return err
			}), nil
		})
}

type closerFunc func(ctx context.Context) error

func (f closerFunc) Close(ctx context.Context) error { return f(ctx) }

// RunDLQ runs dlq-consumer until ctx is cancelled; `dlq-consumer rebuild
// --config …` instead rebuilds the Redis index from the DLQ topic and exits.
func RunDLQ(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "rebuild" {
		return rebuildDLQ(ctx, args[1:])
	}
	return run(ctx, "dlq-consumer", args, config.LoadDLQConsumer,
		func(c *config.DLQConsumer) config.Common { return c.Common },
		func(ctx context.Context, c *config.DLQConsumer, b *daemon.Base) (closer, error) {
			return StartDLQ(ctx, c, b)
		})
}

// rebuildDLQ empties the DLQ index and re-reads the DLQ topic from the
// beginning into it (the topic is the source of truth, the index a view).
func rebuildDLQ(ctx context.Context, args []string) error {
	flags, err := daemon.ParseFlags("dlq-consumer rebuild", args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadDLQConsumer(flags.Config)
	if err != nil {
		return err
	}
	cfg.Ops.Addr = "127.0.0.1:0" // a one-shot command; the daemon may run beside it
	cfg.Coord.Enabled = false    // and is no member of the fleet
	base, err := daemon.Start(ctx, "dlq-consumer", cfg.Common)
	if err != nil {
		return err
	}
	defer base.Close(context.Background())
	opts := []dlq.Option{dlq.WithLogger(base.Log)}
	idx := dlq.NewIndex(base.Redis, cfg.Redis.KeyPrefix, opts...)
	cons, err := dlq.NewConsumer(dlq.ConsumerConfig{Kafka: cfg.Kafka}, idx, dlq.NewPolicy(cfg.Recovery, opts...), opts...)
	if err != nil {
		return err
	}
	n, err := cons.Rebuild(ctx)
	if err != nil {
		return fmt.Errorf("rebuild after %d records: %w", n, err)
	}
	st, err := idx.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("rebuilt from %d records: total=%d due=%d review=%d retried=%d by_reason=%v\n",
		n, st.Total, st.Due, st.Review, st.Retried, st.ByReason)
	return nil
}
