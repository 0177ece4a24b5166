// Command schedule-consumer consumes the main topic and hands each user's
// messages, in order, to the handler configured by handler.type. A team
// with a Go handler runs kfpipe.RunConsumer with it instead: the same
// entry point (see examples/faqbot).
package main

import (
	"fmt"
	"os"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/version"
)

func main() {
	if version.Handle(os.Stdout, "schedule-consumer", os.Args[1:], daemon.Librdkafka) {
		return
	}
	ctx, stop := daemon.SignalContext()
	err := kfpipe.RunConsumer(ctx, os.Args[1:], nil)
	stop()
	if daemon.Failed(ctx, err) {
		fmt.Fprintf(os.Stderr, "schedule-consumer: %v\n", err)
		os.Exit(1)
	}
}
