package service

import (
	"context"
	"fmt"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/outcome"
)

// recordOutcomes wraps h so that each message's outcome and its replies
// are written to the outcomes topic for the conversation archive, when
// the archive is on (archive.dsn set); it returns h as it is otherwise.
// The topic is created when missing.
func recordOutcomes(ctx context.Context, cfg *config.Consumer, base *daemon.Base, h consumer.Handler) (consumer.Handler, *outcome.Writer, error) {
	if cfg.Archive.DSN == "" || cfg.Archive.OutcomesTopic == "" {
		return h, nil, nil
	}
	if base.Admin != nil {
		if err := kafkaclient.Bootstrap(ctx, base.Admin, outcome.Topic(cfg.Kafka, cfg.Archive)); err != nil {
			return nil, nil, fmt.Errorf("archive.outcomes_topic: %w", err)
		}
	}
	w, err := outcome.NewWriter(cfg.Kafka, cfg.Archive.OutcomesTopic, base.Log, base.Registry)
	if err != nil {
		return nil, nil, err
	}
	return outcome.Wrap(h, w), w, nil
}
