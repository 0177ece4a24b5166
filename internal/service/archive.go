package service

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
)

// The conversation archive in the dlq-consumer: the archiver beside the
// DLQ consumer (its own group, off the schedule-consumers' path). The
// timeline's reads of it (console.ArchiveSource) are internal/console/sources'.

// openArchive opens the archive when archive.dsn is set (nil when not).
// A database that does not answer at start-up stops the daemon with the
// key named, as a bad configuration does.
func openArchive(ctx context.Context, cfg *config.DLQConsumer) (*archive.Store, error) {
	if cfg.Archive.DSN == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := archive.Open(ctx, cfg.Archive.DSN, cfg.Archive.Retention)
	if err != nil {
		return nil, fmt.Errorf("archive.dsn: %w", err)
	}
	return s, nil
}

// startArchiver runs the archiver until ctx ends (Close).
func (d *DLQ) startArchiver(ctx context.Context, cfg *config.DLQConsumer, registry *prometheus.Registry) {
	if d.archive == nil {
		return
	}
	var reg prometheus.Registerer
	if registry != nil {
		reg = registry
	}
	a := archive.NewArchiver(cfg.Kafka, cfg.Archive, d.archive, d.log, reg)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := a.Run(ctx); err != nil {
			d.log.Error("archiver stopped", zap.Error(err))
		}
	}()
	d.log.Info("archiving the conversation", zap.String("group", cfg.Archive.GroupID),
		zap.Duration("retention", cfg.Archive.Retention))
}
