// Command kfpipe-demo runs the whole pipeline in one process — a fake
// WeChat, kf-producer, schedule-consumer and dlq-consumer — against
// embedded Kafka and Redis (or real ones with --kafka/--redis), plays a
// scripted day of customer service and prints a report whose last line
// is machine-readable.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"

	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/demo"
)

func main() {
	daemon.Main("kfpipe-demo", func(ctx context.Context, args []string) error { return run(ctx, args, os.Stdout, os.Stderr) })
}

// errViolated is returned when the report shows a lost or reordered
// message (recovered letters included: a user's come back in order), so
// `make demo` fails loudly if an invariant breaks.
var errViolated = errors.New("invariant violated: lost or reordered messages (see the report)")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kfpipe-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o       demo.Options
		short   = fs.Bool("short", false, "a smaller, faster scenario (tests)")
		quiet   = fs.Bool("quiet", false, "no progress bar")
		users   = fs.Int("users", 0, "normal customers (default 300, 40 with --short)")
		verbose = fs.Bool("verbose", false, "daemons log at info level (default: errors only)")
	)
	fs.StringVar(&o.Kafka, "kafka", "", "host:port of a real Kafka (default: embedded mock cluster)")
	fs.StringVar(&o.Redis, "redis", "", "host:port of a real Redis (default: embedded miniredis)")
	fs.StringVar(&o.Archive, "archive", "", "postgres://... DSN: keep the conversation in PostgreSQL and read the timeline from it (default: no database)")
	fs.StringVar(&o.ConfigPath, "config", "", "base config (default: config/development.yaml, found upwards)")
	fs.BoolVar(&o.Hold, "hold", false, "keep everything up after the report until Ctrl-C (admin console stays reachable)")
	fs.Uint64Var(&o.Seed, "seed", 1, "scenario seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Scenario = demo.FullScenario()
	if *short {
		o.Scenario = demo.ShortScenario()
	}
	if *users > 0 {
		o.Scenario.Users = *users
	}
	if *verbose {
		o.LogLevel = "info"
	}
	o.Out, o.Notice = stdout, stderr
	if !*quiet && isTerminal(stderr) {
		o.Progress = stderr
	}
	rep, err := demo.Run(ctx, o)
	if err != nil {
		return err
	}
	if rep.Lost > 0 || rep.Reordered > 0 || rep.RecoveredOutOfOrder > 0 {
		return errViolated
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
