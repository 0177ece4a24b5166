package kfpipe

import (
	"context"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
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
func RunConsumer(ctx context.Context, args []string, h Handler) error {
	return service.RunConsumerWith(ctx, args, func(ctx context.Context, cfg *config.Consumer, base *daemon.Base) (consumer.Handler, func(), error) {
		fx, closeFx, err := reply.FromConfig(ctx, cfg, base)
		if err != nil {
			return nil, nil, err
		}
		if h != nil {
			return reply.Wrap(adapt(h), fx), closeFx, nil
		}
		// The built-in handler; an http receiver's answer may carry replies.
		ih, err := consumer.NewHandler(cfg.Handler, base.Log, webhookReplies)
		if err != nil {
			closeFx()
			return nil, nil, err
		}
		return reply.Wrap(ih, fx), closeFx, nil
	})
}

// adapt turns h into the consumer's handler, called with the public
// Message.
func adapt(h Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		return h.Handle(ctx, fromChat(c))
	})
}
