// Command kf-producer answers the WeChat callback, pulls messages with
// sync_msg and produces them to Kafka, advancing the cursor only after delivery.
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
		fmt.Fprintf(os.Stderr, "kf-producer: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	flags, err := daemon.ParseFlags("kf-producer", args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadProducer(flags.Config)
	if err != nil {
		return err
	}
	base, err := daemon.Start(ctx, "kf-producer", cfg.Common)
	if err != nil {
		return err
	}
	svc, err := service.StartProducer(ctx, cfg, base)
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
