// Command kf-producer answers the WeChat callback, pulls messages with
// sync_msg and produces them to Kafka, advancing the cursor only after
// delivery.
package main

import (
	"fmt"
	"os"

	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/version"
)

func main() {
	if version.Handle(os.Stdout, "kf-producer", os.Args[1:], daemon.Librdkafka) {
		return
	}
	ctx, stop := daemon.SignalContext()
	err := service.RunProducer(ctx, os.Args[1:])
	stop()
	if daemon.Failed(ctx, err) {
		fmt.Fprintf(os.Stderr, "kf-producer: %v\n", err)
		os.Exit(1)
	}
}
