// Command kf-producer answers the WeChat callback, pulls messages with
// sync_msg and produces them to Kafka, advancing the cursor only after delivery.
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
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Ops.ShutdownTimeout)
	defer cancel()
	return base.Close(sctx)
}
