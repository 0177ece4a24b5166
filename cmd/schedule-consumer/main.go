// Command schedule-consumer consumes the main topic and hands each user's
// messages, in order, to the handler configured by handler.type. A team
// with a Go handler runs kfpipe.RunConsumer with it instead: the same
// entry point (see examples/faqbot).
package main

import (
	"context"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/daemon"
)

func main() {
	daemon.Main("schedule-consumer", func(ctx context.Context, args []string) error { return kfpipe.RunConsumer(ctx, args, nil) })
}
