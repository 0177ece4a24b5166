package kfpipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/history"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/service"
)

// RunConsumer runs the schedule-consumer daemon with h until ctx ends
// (SIGINT/SIGTERM in a main: see the examples), then shuts it down
// gracefully. args are the daemon's command-line arguments: --config FILE
// (or KFPIPE_CONFIG), the same file the three daemons read. h nil runs the
// handler the file's handler.type names; cmd/schedule-consumer is exactly
// that; with handler.type http, the replies in the receiver's answers are
// sent (docs/handler-protocol.md). Replies (Reply, Welcome, Transfer) go
// through wecom.base_url with wecom.corp_id and wecom.secret, with the
// access token cached in Redis beside kf-producer's.
//
// With a handler h, -h or --help in args prints the bot's usage, naming
// the program, to stderr and returns nil; and RunConsumer first checks
// that one of
// kafka.brokers and redis.addr (single mode) accept a connection, for a
// few seconds, and returns one error naming the key when not, instead of
// starting a consumer that logs connection errors.
func RunConsumer(ctx context.Context, args []string, h Handler) error {
	if h != nil && HelpAsked(args) {
		PrintUsage(os.Stderr, false)
		return nil
	}
	if h != nil {
		if err := reachable(ctx, args); err != nil {
			return err
		}
	}
	return service.RunConsumerWith(ctx, args, func(ctx context.Context, cfg *config.Consumer, base *daemon.Base) (handler.Handler, func(), error) {
		fx, closeFx, err := reply.FromConfig(ctx, cfg, base)
		if err != nil {
			return nil, nil, err
		}
		var ch handler.Handler
		if h != nil {
			ch = adapt(h)
		} else if ch, err = service.NewHandler(cfg.Handler, base.Log, webhookReplies); err != nil {
			// The built-in handler; an http receiver's answer may carry replies.
			closeFx()
			return nil, nil, err
		}
		if ch, err = keepMedia(ctx, cfg, base, reply.Wrap(ch, fx)); err != nil {
			closeFx()
			return nil, nil, err
		}
		ch, closeHistory, err := withHistory(ctx, cfg, ch, nil)
		if err != nil {
			closeFx()
			return nil, nil, err
		}
		return ch, func() { closeFx(); closeHistory() }, nil
	})
}

// adapt turns h into the consumer's handler, called with the public
// Message.
func adapt(h Handler) handler.Handler {
	return handler.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		m := fromChat(c)
		d := handler.DeliveryFrom(ctx)
		m.RetryFromDLQ, m.RetryCount = d.RetryFromDLQ, d.RetryCount
		return h.Handle(ctx, m)
	})
}

// Config is the schedule-consumer's configuration as a Go value: the keys
// of the YAML file the daemons read (docs/operations.md), as fields
// (kafka.brokers is Kafka.Brokers). Start from LoadConfig and change what
// a program or a test needs; NewConsumer validates it.
type Config = config.Consumer

// LoadConfig reads the configuration file the daemons read ("" reads none:
// the defaults of the environment KFPIPE_ENV names), applies the KFPIPE_…
// environment overrides, and validates it; an error names the bad key.
func LoadConfig(path string) (*Config, error) { return config.LoadConsumer(path) }

// Consumer is a schedule-consumer running a Go handler, built in code
// (NewConsumer) instead of from the command line (RunConsumer).
type Consumer struct {
	cfg   Config
	h     Handler
	batch *batchRun // NewBatchConsumer's (batch.go); nil for NewConsumer's
	// memory serves History from memory (WithMemoryHistory); nil: the
	// archive, when archive.dsn is set.
	memory *history.Memory
}

// ConsumerOption configures a Consumer.
type ConsumerOption func(*Consumer)

// WithMiddleware wraps the consumer's handler in mw (Chain's order).
func WithMiddleware(mw ...Middleware) ConsumerOption {
	return func(c *Consumer) { c.h = Chain(c.h, mw...) }
}

// NewConsumer returns a consumer that runs h with cfg (copied); it checks
// cfg and connects to nothing until Run.
func NewConsumer(cfg *Config, h Handler, opts ...ConsumerOption) (*Consumer, error) {
	if cfg == nil {
		return nil, errors.New("kfpipe: NewConsumer needs a configuration (LoadConfig)")
	}
	if h == nil {
		return nil, errors.New("kfpipe: NewConsumer needs a handler")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: *cfg, h: h}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Run runs the consumer until ctx ends, then shuts it down gracefully
// within ops.shutdown_timeout, as RunConsumer does; it returns an error
// when it cannot start (Kafka, Redis or WeChat's settings) or shut down.
func (c *Consumer) Run(ctx context.Context) error {
	cfg := c.cfg
	base, err := daemon.Start(ctx, "schedule-consumer", cfg.Common)
	if err != nil {
		return err
	}
	fx, closeFx, err := reply.FromConfig(ctx, &cfg, base)
	if err != nil {
		_ = base.Close(context.Background())
		return err
	}
	h, copts := c.handler()
	ch, err := keepMedia(ctx, &cfg, base, reply.Wrap(h, fx))
	closeHistory := func() {}
	if err == nil {
		ch, closeHistory, err = withHistory(ctx, &cfg, ch, c.memory)
	}
	var s *service.Consumer
	if err == nil {
		s, err = service.StartConsumer(ctx, &cfg, base, ch, copts...)
	}
	if err != nil {
		closeHistory()
		closeFx()
		_ = base.Close(context.Background())
		return err
	}
	defer closeHistory()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Ops.ShutdownTimeout)
	defer cancel()
	err = s.Close(sctx)
	closeFx()
	return errors.Join(err, base.Close(sctx))
}

// HelpAsked reports whether args ask for the usage (-h, -help, --help).
func HelpAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			return true
		case "--", "-":
			return false
		}
	}
	return false
}

// PrintUsage writes a bot's usage, named after the running program, to w:
// its flags, and --simulate with simulate (kfpipesim.Main's).
func PrintUsage(w io.Writer, simulate bool) {
	name := filepath.Base(os.Args[0])
	fmt.Fprintf(w, "Usage of %s (a kfpipe bot: the schedule-consumer with its own handler):\n", name)
	fmt.Fprintf(w, "  %s --config FILE\n", name)
	if simulate {
		fmt.Fprintf(w, "  %s --simulate[=ADDR] [--config FILE]\n", name)
	}
	fmt.Fprintln(w, "\nFlags:")
	fmt.Fprintln(w, "  --config FILE      the configuration file the daemons read (default $KFPIPE_CONFIG);")
	fmt.Fprintln(w, "                     KFPIPE_<KEY> environment variables override its keys")
	fmt.Fprintln(w, "                     (KFPIPE_KAFKA_BROKERS for kafka.brokers)")
	if simulate {
		fmt.Fprintln(w, "  --simulate[=ADDR]  chat with the bot in a browser on ADDR (default 127.0.0.1:8095):")
		fmt.Fprintln(w, "                     the whole pipeline in this process, no Kafka or Redis needed")
	}
	fmt.Fprintln(w, "  -h, --help         this text")
}

// reachTimeout is how long reachable waits for Kafka and Redis.
const reachTimeout = 5 * time.Second

// reachable checks that a broker of kafka.brokers and, in single mode,
// redis.addr accept a TCP connection within reachTimeout; the error names
// the key, its value and how to set it.
func reachable(ctx context.Context, args []string) error {
	flags, err := daemon.ParseFlags("schedule-consumer", args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadConsumer(flags.Config)
	if err != nil {
		return err
	}
	check := func(key, env, value string, addrs []string) error {
		deadline := time.Now().Add(reachTimeout)
		var last error
		for {
			for _, a := range addrs {
				c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", strings.TrimSpace(a))
				if err == nil {
					_ = c.Close()
					return nil
				}
				last = err
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s is %q and nothing there accepts a connection (%v): start it, or set %s in --config FILE or %s; to chat with the bot without Kafka or Redis, run it with --simulate",
					key, value, last, key, env)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if err := check("kafka.brokers", "KFPIPE_KAFKA_BROKERS", cfg.Kafka.Brokers, strings.Split(cfg.Kafka.Brokers, ",")); err != nil {
		return err
	}
	if cfg.Redis.Mode == "single" || cfg.Redis.Mode == "" {
		return check("redis.addr", "KFPIPE_REDIS_ADDR", cfg.Redis.Addr, []string{cfg.Redis.Addr})
	}
	return nil
}
