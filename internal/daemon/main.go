package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kfpipe/kfpipe/internal/version"
)

// Main is a command's whole main: --version (version.Handle), a context
// cancelled on SIGINT or SIGTERM, run with the arguments, and exit status
// 1 with "name: error" on stderr when run failed (Failed: a shutdown
// requested while starting and -h are not failures).
func Main(name string, run func(ctx context.Context, args []string) error) {
	if version.Handle(os.Stdout, name, os.Args[1:], Librdkafka) {
		return
	}
	ctx, stop := SignalContext()
	code := exitCode(ctx, name, run(ctx, os.Args[1:]), os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode is Main's verdict on run's error: 0, or 1 after saying why.
func exitCode(ctx context.Context, name string, err error, stderr io.Writer) int {
	if !Failed(ctx, err) || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}
