// Command dlq-consumer indexes dead letters, schedules their retries and
// serves the admin API and console.
package main

import (
	"fmt"
	"os"

	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/version"
)

func main() {
	if version.Handle(os.Stdout, "dlq-consumer", os.Args[1:], daemon.Librdkafka) {
		return
	}
	ctx, stop := daemon.SignalContext()
	err := service.RunDLQ(ctx, os.Args[1:])
	stop()
	if daemon.Failed(ctx, err) {
		fmt.Fprintf(os.Stderr, "dlq-consumer: %v\n", err)
		os.Exit(1)
	}
}
