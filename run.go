package kfpipe

import (
	"context"
	"fmt"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/once"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
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
		fx, closeFx, err := newEffects(ctx, cfg, base)
		if err != nil {
			return nil, nil, err
		}
		if h != nil {
			return adapt(h, fx), closeFx, nil
		}
		// The built-in handler; an http receiver's answer may carry replies.
		ih, err := consumer.NewHandler(cfg.Handler, base.Log, webhookReplies)
		if err != nil {
			closeFx()
			return nil, nil, err
		}
		return consumer.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
			return ih.Handle(withReplier(ctx, fx, fromChat(c)), c)
		}), closeFx, nil
	})
}

// newEffects builds the reply side from the consumer's configuration; nil
// (replies answer ErrNoReplier) without WeChat credentials.
func newEffects(ctx context.Context, cfg *config.Consumer, base *daemon.Base) (*effects, func(), error) {
	if cfg.WeCom.CorpID == "" || cfg.WeCom.Secret == "" {
		return nil, func() {}, nil
	}
	kc, err := kf.New(kf.Config{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout, Tokens: wecom.NewRedisTokenCache(base.Redis, cfg.Redis.KeyPrefix)})
	if err != nil {
		return nil, nil, fmt.Errorf("wecom: %w", err)
	}
	oc, err := once.New(ctx, "replies", once.Config{Client: base.Redis, KeyPrefix: cfg.Redis.KeyPrefix + "reply:",
		Lease: cfg.Dedup.Lease, Batch: once.BatchConfig{Enabled: true}}, once.WithLogger(base.Log))
	if err != nil {
		return nil, nil, fmt.Errorf("replies: %w", err)
	}
	return &effects{once: oc, kf: kc}, func() { _ = oc.Close() }, nil
}

// adapt turns h into the consumer's handler: each call gets the public
// Message and a context that carries its replies.
func adapt(h Handler, fx *effects) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		m := fromChat(c)
		return h.Handle(withReplier(ctx, fx, m), m)
	})
}
