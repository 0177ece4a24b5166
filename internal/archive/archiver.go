package archive

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/outcome"
)

// Archiver reads the main topic and the DLQ topic in a consumer group of
// its own (archive.group_id) and writes every message and every dead
// letter to the Store in batches. A partition's offset is committed only
// after the batch holding its records was committed in PostgreSQL, so a
// crash re-reads at most the batches not yet committed, and their rows
// conflict with themselves and change nothing: each message is archived
// exactly once. It never touches the schedule-consumers' path: a slow or
// down database makes its own group lag, nothing else.
type Archiver struct {
	kcfg  config.Kafka
	cfg   config.Archive
	store *Store
	log   *zap.Logger
	m     archiverMetrics
}

type archiverMetrics struct {
	records     prometheus.Counter // read from Kafka and written (or known)
	rows        prometheus.Counter // new rows
	writeErrors prometheus.Counter
	batch       prometheus.Histogram
}

// NewArchiver returns an archiver writing to store; Run runs it. Its
// metrics are registered on reg (nil: none).
func NewArchiver(kcfg config.Kafka, cfg config.Archive, store *Store, log *zap.Logger, reg prometheus.Registerer) *Archiver {
	if log == nil {
		log = zap.NewNop()
	}
	m := archiverMetrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfpipe_archive_records_total",
			Help: "Main-topic and DLQ records the archiver has written to the archive (its offsets committed after)."}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfpipe_archive_rows_new_total",
			Help: "Rows the archiver inserted (a record already archived adds none)."}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfpipe_archive_write_errors_total",
			Help: "Failed batch writes to PostgreSQL (each retried until it succeeds)."}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kfpipe_archive_batch_seconds",
			Help: "Time to write one batch (COPY, insert, progress) to PostgreSQL.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.records, m.rows, m.writeErrors, m.batch} {
			// A second archiver on the same registry (tests) counts on
			// its own; the first one's series stay.
			_ = reg.Register(c)
		}
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 5000
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 200 * time.Millisecond
	}
	return &Archiver{kcfg: kcfg, cfg: cfg, store: store, log: log.Named("archiver"), m: m}
}

// dropEvery is how often the archiver drops the day partitions past the
// retention (the first time at start).
const dropEvery = time.Hour

// batch is the rows read and not yet written, and the offsets they reach.
type batch struct {
	rows     []Row
	next     map[kafka.TopicPartition]int64 // keyed by topic (pointer-free copy) and partition
	recTime  map[kafka.TopicPartition]time.Time
	since    time.Time // when its first record was added
	topicOf  map[string]*string
	nRecords int
}

func newBatch() *batch {
	return &batch{next: map[kafka.TopicPartition]int64{}, recTime: map[kafka.TopicPartition]time.Time{}, topicOf: map[string]*string{}}
}

func (b *batch) key(topic string, p int32) kafka.TopicPartition {
	t, ok := b.topicOf[topic]
	if !ok {
		t = &topic
		b.topicOf[topic] = t
	}
	return kafka.TopicPartition{Topic: t, Partition: p}
}

func (b *batch) empty() bool { return len(b.next) == 0 }

// Run archives until ctx is cancelled; then it writes and commits what it
// read. It returns nil on cancellation.
func (a *Archiver) Run(ctx context.Context) error {
	main, dlqTopic, outTopic := a.kcfg.Topics.Main.Name, a.kcfg.Topics.DLQ.Name, a.cfg.OutcomesTopic
	topics := []string{main, dlqTopic}
	cm := kafkaclient.Consumer(a.kcfg, a.cfg.GroupID)
	_ = cm.SetKey("client.id", a.kcfg.ClientID+"-archiver")
	// A new group reads everything the topics still hold.
	_ = cm.SetKey("auto.offset.reset", "earliest")
	// The end of a partition may be a transaction marker, never delivered:
	// its end-of-partition event carries the offset past it.
	_ = cm.SetKey("enable.partition.eof", true)
	kc, err := kafka.NewConsumer(cm)
	if err != nil {
		return fmt.Errorf("archiver: %w", err)
	}
	defer kc.Close()
	if outTopic != "" {
		// The consumers create it when they start with the archive on;
		// created here too, so the archiver may start first.
		if err := a.ensureOutcomesTopic(ctx, kc); err != nil {
			return err
		}
		topics = append(topics, outTopic)
	}
	b := newBatch()
	// flush writes b until it is written (or ctx ends: then nothing of it
	// is committed) and commits its offsets.
	flush := func(ctx context.Context) error {
		if b.empty() {
			return nil
		}
		progress := make([]Progress, 0, len(b.next))
		commits := make([]kafka.TopicPartition, 0, len(b.next))
		for tp, next := range b.next {
			progress = append(progress, Progress{Topic: *tp.Topic, Partition: tp.Partition, NextOffset: next, RecordTime: b.recTime[tp]})
			commits = append(commits, kafka.TopicPartition{Topic: tp.Topic, Partition: tp.Partition, Offset: kafka.Offset(next)})
		}
		backoff := 100 * time.Millisecond
		for {
			t := time.Now()
			n, err := a.store.Write(ctx, b.rows, progress)
			if err == nil {
				a.m.batch.Observe(time.Since(t).Seconds())
				a.m.records.Add(float64(b.nRecords))
				a.m.rows.Add(float64(n))
				a.log.Debug("archived", zap.Int("rows", len(b.rows)), zap.Int("new", n), zap.Duration("took", time.Since(t)))
				break
			}
			a.m.writeErrors.Inc()
			a.log.Warn("archive write failed; retrying", zap.Int("rows", len(b.rows)), zap.Error(err))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
		}
		if _, err := kc.CommitOffsets(commits); err != nil {
			// Not fatal: the rows are written, re-reading them is a no-op.
			a.log.Warn("archiver commit failed", zap.Error(err))
		}
		b = newBatch()
		return nil
	}
	err = kc.SubscribeTopics(topics, func(_ *kafka.Consumer, ev kafka.Event) error {
		if _, ok := ev.(kafka.RevokedPartitions); ok {
			// Written and committed before the partitions go, so their
			// next owner starts after them.
			if err := flush(ctx); err != nil {
				a.log.Warn("archiver: batch not written before revoke; the next owner re-reads it", zap.Error(err))
				b = newBatch()
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archiver subscribe: %w", err)
	}
	var lastDrop time.Time
	for ctx.Err() == nil {
		if time.Since(lastDrop) >= dropEvery {
			lastDrop = time.Now()
			if dropped, err := a.store.DropExpired(ctx); err != nil {
				a.log.Warn("archive: dropping expired day partitions", zap.Error(err))
			} else if len(dropped) > 0 {
				a.log.Info("archive: expired day partitions dropped", zap.Strings("partitions", dropped))
			}
		}
		ev := kc.Poll(50)
		switch e := ev.(type) {
		case *kafka.Message:
			tp := b.key(*e.TopicPartition.Topic, e.TopicPartition.Partition)
			if b.empty() {
				b.since = time.Now()
			}
			switch topic := *e.TopicPartition.Topic; {
			case topic == outTopic:
				b.rows = append(b.rows, OutcomeRows(e.Value, e.TopicPartition.Partition, int64(e.TopicPartition.Offset), e.Timestamp)...)
			default:
				if r, ok := a.row(e, topic == dlqTopic); ok {
					b.rows = append(b.rows, r)
				}
			}
			b.next[tp] = int64(e.TopicPartition.Offset) + 1
			if e.Timestamp.After(b.recTime[tp]) {
				b.recTime[tp] = e.Timestamp
			}
			b.nRecords++
		case kafka.PartitionEOF:
			if e.Topic != nil && e.Offset >= 0 {
				tp := b.key(*e.Topic, e.Partition)
				if int64(e.Offset) > b.next[tp] {
					if b.empty() {
						b.since = time.Now()
					}
					b.next[tp] = int64(e.Offset)
				}
			}
		case kafka.Error:
			a.log.Warn("archiver consumer error", zap.Error(e))
		}
		if !b.empty() && (b.nRecords >= a.cfg.BatchSize || time.Since(b.since) >= a.cfg.FlushInterval) {
			if err := flush(ctx); err != nil {
				return nil // cancelled while the database failed: nothing committed
			}
		}
	}
	// Shutdown: write what was read, for a bounded time.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := flush(fctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// row turns a record into its row; ok false for a record with nothing to
// keep (undecodable: its dead letter says so; a DLQ event record).
func (a *Archiver) row(m *kafka.Message, fromDLQ bool) (Row, bool) {
	if fromDLQ {
		dl, err := dlq.Decode(m.Value)
		if err != nil || dl.Event != "" || dl.Original == nil || dl.Original.UpstreamMsgID == "" {
			return Row{}, false
		}
		o := dl.Original
		return Row{At: sendTime(o, dl.FailureTime), MsgID: o.UpstreamMsgID, Kind: KindDeadLetter, Seq: dl.RetryCount,
			OpenKfID: o.OpenKfID, ExternalUserID: o.ExternalUserID, MsgType: o.MsgType, Origin: o.Origin,
			ServicerUserID: o.ServicerUserID, Reason: string(dl.Reason), Detail: dl.Details,
			Partition: dl.SourcePartition, Offset: dl.SourceOffset, Recorded: dl.FailureTime}, true
	}
	cm, err := chatmsg.Decode(m.Value)
	if err != nil {
		return Row{}, false
	}
	return FromMessage(cm, m.TopicPartition.Partition, int64(m.TopicPartition.Offset), m.Timestamp), true
}

// FromMessage is the row of a main-topic message read at partition and
// offset, received at recorded.
func FromMessage(cm *chatmsg.ChatMessage, partition int32, offset int64, recorded time.Time) Row {
	return Row{At: sendTime(cm, recorded), MsgID: cm.UpstreamMsgID, Kind: KindMessage, OpenKfID: cm.OpenKfID,
		ExternalUserID: cm.ExternalUserID, MsgType: cm.MsgType, Origin: cm.Origin, ServicerUserID: cm.ServicerUserID,
		Content: cm.Content, Partition: partition, Offset: offset, Recorded: recorded.UTC()}
}

func sendTime(cm *chatmsg.ChatMessage, fallback time.Time) time.Time {
	if cm.SendTime > 0 {
		return time.Unix(cm.SendTime, 0).UTC()
	}
	return fallback.UTC()
}

// ensureOutcomesTopic creates the outcomes topic when missing, with the
// main topic's settings (outcome.Topic's), retrying while ctx lasts.
func (a *Archiver) ensureOutcomesTopic(ctx context.Context, kc *kafka.Consumer) error {
	ac, err := kafka.NewAdminClientFromConsumer(kc)
	if err != nil {
		return fmt.Errorf("archiver: %w", err)
	}
	defer ac.Close()
	t := a.kcfg.Topics.Main
	t.Name = a.cfg.OutcomesTopic
	for backoff := time.Second; ; backoff = min(2*backoff, 30*time.Second) {
		err := kafkaclient.Bootstrap(ctx, ac, t)
		if err == nil || errors.Is(err, kafkaclient.ErrPartitionMismatch) {
			return err
		}
		a.log.Warn("archiver: outcomes topic not created yet; retrying", zap.String("topic", t.Name), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
}

// OutcomeRows are the rows of a record of the outcomes topic read at
// partition and offset, written at recorded: the message's outcome and
// its replies (failed replies are not recorded; a reply an earlier run
// sent is sent). An undecodable record has none.
func OutcomeRows(value []byte, partition int32, offset int64, recorded time.Time) []Row {
	rec, err := outcome.Decode(value)
	if err != nil || rec.MsgID == "" {
		return nil
	}
	at := time.Unix(rec.SendTime, 0).UTC()
	if rec.SendTime <= 0 {
		at = recorded.UTC()
	}
	base := Row{At: at, MsgID: rec.MsgID, OpenKfID: rec.OpenKfID, ExternalUserID: rec.User,
		Partition: partition, Offset: offset, Recorded: recorded.UTC()}
	var rows []Row
	switch rec.Outcome {
	case outcome.Handled, outcome.Recovered:
		r := base
		r.Kind, r.Seq = KindHandled, rec.Retry
		if rec.Outcome == outcome.Recovered {
			r.Kind = KindRecovered
		}
		if !rec.At.IsZero() {
			r.Recorded = rec.At.UTC()
		}
		rows = append(rows, r)
	}
	for _, rp := range rec.Replies {
		r := base
		r.Kind, r.Seq, r.Origin, r.MsgType, r.Content, r.Detail = KindReply, rp.N, OriginBot, rp.MsgType, rp.Content, rp.Error
		switch rp.Outcome {
		case "sent":
			r.Reason = ReplySent
		case "skipped":
			r.Reason, r.Detail = ReplySent, "sent by an earlier run of the handler"
		case "servicer_session":
			r.Reason = ReplyServicerSession
		case "refused":
			r.Reason = ReplyRefused
		default:
			continue
		}
		if rp.What != "reply" && rp.What != "" {
			r.Detail = strings.TrimSpace(rp.What + " " + r.Detail)
		}
		if !rp.At.IsZero() {
			r.Recorded = rp.At.UTC()
		}
		rows = append(rows, r)
	}
	return rows
}
