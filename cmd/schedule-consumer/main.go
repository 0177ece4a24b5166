// Command schedule-consumer consumes the main topic and hands each user's
// messages, in order, to the business Handler.
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
		fmt.Fprintf(os.Stderr, "schedule-consumer: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	flags, err := daemon.ParseFlags("schedule-consumer", args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadConsumer(flags.Config)
	if err != nil {
		return err
	}
	base, err := daemon.Start(ctx, "schedule-consumer", cfg.Common)
	if err != nil {
		return err
	}
	svc, err := service.StartConsumer(ctx, cfg, base, nil)
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
