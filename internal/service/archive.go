package service

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/kf"
)

// The conversation archive in the dlq-consumer: the archiver beside the
// DLQ consumer (its own group, off the schedule-consumers' path), and the
// timeline's reads of it (console.ArchiveSource).

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

// ArchiveRetention is how far back the archive answers (0: no archive).
func (p pipelineView) ArchiveRetention() time.Duration {
	if p.archive == nil {
		return 0
	}
	return p.archive.Retention()
}

// ArchivedRecords reads the user's messages sent in [since, until) from
// the archive, and how far the archiver has come on the user's partition
// of the main topic.
func (p pipelineView) ArchivedRecords(ctx context.Context, user string, since, until time.Time, limit int) (console.ArchiveRead, error) {
	read := console.ArchiveRead{Retention: p.archive.Retention(), From: since, To: until}
	rows, more, err := p.archive.Conversation(ctx, user, since, until, limit)
	if err != nil {
		return read, err
	}
	read.Truncated = more
	for _, r := range rows {
		if r.Kind != archive.KindMessage {
			continue // the DLQ index has the letters, with their state
		}
		read.Records = append(read.Records, archiveRecord(r))
	}
	if more && len(rows) > 0 {
		// The newest max were read: the range read starts at the oldest.
		read.From = rows[0].At
	}
	// The lag on the user's partition: its high watermark against the
	// archiver's progress.
	topic := p.topic
	md, err := p.kafka.GetMetadata(&topic, false, 5000)
	if err != nil {
		return read, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || len(tm.Partitions) == 0 {
		return read, fmt.Errorf("metadata of %s: no partitions", topic)
	}
	read.Partition = kafkaclient.KeyPartition(user, len(tm.Partitions))
	progress, err := p.archive.Progress(ctx, topic)
	if err != nil {
		return read, err
	}
	for _, pr := range progress {
		if pr.Partition == read.Partition {
			read.ArchivedOffset, read.ArchivedUpTo = pr.NextOffset, pr.RecordTime.UTC()
		}
	}
	if p.group != nil {
		if _, high, err := p.group.QueryWatermarkOffsets(topic, read.Partition, 5000); err == nil {
			read.BehindBy = max(0, high-read.ArchivedOffset)
		}
	}
	return read, nil
}

// archiveRecord is an archived message as the timeline's record of it.
func archiveRecord(r archive.Row) console.TopicRecord {
	rec := console.TopicRecord{MainRecord: console.MainRecord{Partition: r.Partition, Offset: r.Offset, Time: r.Recorded,
		UpstreamMsgID: r.MsgID, OpenKfID: r.OpenKfID, MsgType: r.MsgType, SendTime: r.At.Unix()}, Archived: true}
	rec.Preview = dlq.Preview(&chatmsg.DeadLetter{Original: &chatmsg.ChatMessage{MsgType: r.MsgType, Content: r.Content}})
	return rec
}

// archivedEffects completes fx, each message's effects as the marks hold
// them, with what the archive recorded: a message handled or recovered
// is done, a reply the customer got is a reply, and one skipped because a
// human servicer held the session says so. The marks last dedup.ttl and
// the reply log reply.TTL; the archive keeps them archive.retention. A
// failed read leaves fx as the marks say.
func (p pipelineView) archivedEffects(ctx context.Context, msgs []console.MessageRef, fx []console.MessageEffects) {
	if p.archive == nil || len(msgs) == 0 {
		return
	}
	ids := make([]string, 0, len(msgs))
	at := map[string][]int{}
	for i, m := range msgs {
		if m.UpstreamMsgID == "" {
			continue
		}
		if at[m.UpstreamMsgID] == nil {
			ids = append(ids, m.UpstreamMsgID)
		}
		at[m.UpstreamMsgID] = append(at[m.UpstreamMsgID], i)
	}
	rows, err := p.archive.Outcomes(ctx, ids)
	if err != nil {
		// The archive's own read (ArchivedRecords) fails and is reported
		// the same way; the marks' answer stands.
		return
	}
	for _, r := range rows {
		for _, i := range at[r.MsgID] {
			m, e := msgs[i], &fx[i]
			if m.OpenKfID != "" && r.OpenKfID != m.OpenKfID {
				continue
			}
			switch r.Kind {
			case archive.KindHandled, archive.KindRecovered:
				e.Done = console.DoneYes
			case archive.KindReply:
				switch r.Reason {
				case archive.ReplySent:
					key := m.OpenKfID + ":" + m.UpstreamMsgID + ":" + strconv.Itoa(r.Seq)
					if !slices.ContainsFunc(e.Replies, func(x console.ReplyMark) bool { return x.Key == key }) {
						e.Replies = append(e.Replies, console.ReplyMark{Key: key, MsgID: kf.MsgID(m.OpenKfID, m.UpstreamMsgID, r.Seq)})
					}
					e.RepliesUnknown = false
				case archive.ReplyServicerSession:
					if e.ReplySkipped == "" {
						e.ReplySkipped = archive.ReplyServicerSession
					}
					e.RepliesUnknown = false
				}
			}
		}
	}
}
