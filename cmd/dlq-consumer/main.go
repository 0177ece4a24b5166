// Command dlq-consumer indexes dead letters, schedules their retries and
// serves the admin API and console.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
)

func main() {
	ctx, stop := daemon.SignalContext()
	err := run(ctx, os.Args[1:])
	stop()
	if daemon.Failed(ctx, err) {
		fmt.Fprintf(os.Stderr, "dlq-consumer: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	flags, err := daemon.ParseFlags("dlq-consumer", args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadDLQConsumer(flags.Config)
	if err != nil {
		return err
	}
	base, err := daemon.Start(ctx, "dlq-consumer", cfg.Common)
	if err != nil {
		return err
	}
	svc, err := service.StartDLQ(ctx, cfg, base)
	if err != nil {
		_ = base.Close(context.Background())
		return err
	}
	<-ctx.Done()
	base.Log.Info("shutting down", zap.Duration("deadline", cfg.Ops.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Ops.ShutdownTimeout)
	defer cancel()
	return errors.Join(svc.Close(sctx), base.Close(sctx))
}
