// Command dlq-consumer indexes dead letters, schedules their retries and
// serves the admin API and console.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
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
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Ops.ShutdownTimeout)
	defer cancel()
	return base.Close(sctx)
}
