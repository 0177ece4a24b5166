// Command schedule-consumer consumes the main topic and hands each user's
// messages, in order, to the business Handler.
package main

import (
	"fmt"
	"os"

	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
)

func main() {
	ctx, stop := daemon.SignalContext()
	err := service.RunConsumer(ctx, os.Args[1:])
	stop()
	if daemon.Failed(ctx, err) {
		fmt.Fprintf(os.Stderr, "schedule-consumer: %v\n", err)
		os.Exit(1)
	}
}
