package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// ConsumerConfig configures the DLQ consumer.
type ConsumerConfig struct {
	Kafka config.Kafka // brokers, DLQ topic, consumer group (kafka.consumer.group_id)
	// CommitEvery commits after this many indexed records (default 100);
	// an idle poll, a revoke and shutdown commit too.
	CommitEvery int
}

// Consumer reads the DLQ topic into the Index. Records
// are indexed one by one in the poll goroutine, so when a poll returns,
// everything polled before is indexed; offsets are committed only for
// indexed records (I2 for the DLQ itself). Indexing is idempotent, so
// re-reading after a crash is harmless.
type Consumer struct {
	cfg    ConsumerConfig
	idx    *Index
	policy *Policy
	clock  Clock
	log    *zap.Logger
	m      consumerMetrics
}

type consumerMetrics struct {
	unrecoverable prometheus.Counter
	undecodable   prometheus.Counter
	reviewPending prometheus.Gauge
	indexFull     prometheus.Gauge
	entries       prometheus.Gauge
	maxEntries    prometheus.Gauge
}

// NewConsumer builds a DLQ consumer; Run runs it. Options: WithLogger,
// WithRegisterer, WithClock.
func NewConsumer(cfg ConsumerConfig, idx *Index, policy *Policy, opts ...Option) (*Consumer, error) {
	if cfg.CommitEvery <= 0 {
		cfg.CommitEvery = 100
	}
	o := buildOptions(opts)
	return &Consumer{cfg: cfg, idx: idx, policy: policy, clock: o.clock, log: o.log.Named("dlq-consumer"),
		m: consumerMetrics{
			unrecoverable: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_messages_unrecoverable_total", Help: "Dead letters placed in manual review (not recoverable or retries exhausted)."})),
			undecodable: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_undecodable_total", Help: "DLQ records that did not decode; indexed raw for review."})),
			reviewPending: newReviewGauge(o.reg),
			indexFull: register(o.reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "kfpipe_dlq_index_full",
				Help: "1 while the DLQ index is at dlq_index.max_entries and new dead letters wait in the DLQ topic."})),
			entries: register(o.reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "kfpipe_dlq_index_entries", Help: "Entries in the DLQ index (every state)."})),
			maxEntries: register(o.reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "kfpipe_dlq_index_max_entries", Help: "dlq_index.max_entries: the bound of the DLQ index (0: none)."})),
		}}, nil
}

// Run consumes until ctx is cancelled, then commits what was indexed and
// leaves the group. It returns nil on cancellation.
func (c *Consumer) Run(ctx context.Context) error {
	cm := kafkaclient.Consumer(c.cfg.Kafka, c.cfg.Kafka.Consumer.GroupID)
	// At the end of a partition its position can be past the last record
	// (the scheduler's transactions end with a commit marker); committing
	// that position lets the scheduler see the index caught up.
	_ = cm.SetKey("enable.partition.eof", true)
	kc, err := kafka.NewConsumer(cm)
	if err != nil {
		return fmt.Errorf("dlq consumer: %w", err)
	}
	defer kc.Close()
	pending := map[int32]kafka.TopicPartition{} // next offset to commit, per partition
	commit := func() {
		if len(pending) == 0 {
			return
		}
		tps := make([]kafka.TopicPartition, 0, len(pending))
		for _, tp := range pending {
			tps = append(tps, tp)
		}
		if _, err := kc.CommitOffsets(tps); err != nil {
			// Not fatal: the records are indexed and re-indexing is a no-op.
			c.log.Warn("dlq commit failed", zap.Error(err))
			return
		}
		clear(pending)
	}
	// held are the partitions paused at a letter the full index refused
	// (dlq_index.max_entries): each waits at that letter, in the topic,
	// until expiry or a purge makes room.
	held := map[int32]kafka.TopicPartition{}
	err = kc.SubscribeTopics([]string{c.cfg.Kafka.Topics.DLQ.Name}, func(_ *kafka.Consumer, ev kafka.Event) error {
		if r, ok := ev.(kafka.RevokedPartitions); ok {
			commit() // everything polled is indexed already
			for _, tp := range r.Partitions {
				delete(held, tp.Partition)
			}
		}
		return nil // the library does the (incremental) assign itself
	})
	if err != nil {
		return fmt.Errorf("dlq subscribe: %w", err)
	}
	n := 0
	lastGauge := time.Time{}
	c.m.maxEntries.Set(float64(c.idx.MaxEntries()))
	for ctx.Err() == nil {
		ev := kc.Poll(100)
		switch e := ev.(type) {
		case nil:
			commit()
			n = 0
		case *kafka.Message:
			if _, ok := held[e.TopicPartition.Partition]; ok {
				continue // fetched before the pause; read again on resume
			}
			res, err := c.applyWithRetry(ctx, e, false)
			if err != nil {
				commit()
				return nil // cancelled while Redis was failing: not committed
			}
			if res == IndexFull {
				c.hold(kc, e.TopicPartition, held)
				continue
			}
			tp := e.TopicPartition
			tp.Offset++
			pending[tp.Partition] = tp
			if n++; n >= c.cfg.CommitEvery {
				commit()
				n = 0
			}
		case kafka.PartitionEOF:
			if _, ok := held[e.Partition]; !ok && e.Offset >= 0 {
				// Everything before the end is indexed (or a marker).
				pending[e.Partition] = kafka.TopicPartition(e)
			}
		case kafka.Error:
			c.log.Warn("dlq consumer error", zap.Error(e))
		}
		if now := time.Now(); now.Sub(lastGauge) > time.Second {
			lastGauge = now
			if v, err := c.idx.reviewCount(ctx); err == nil {
				c.m.reviewPending.Set(float64(v))
			}
			if v, err := c.idx.Size(ctx); err == nil {
				c.m.entries.Set(float64(v))
			}
			c.release(ctx, kc, held)
		}
	}
	commit()
	return nil
}

// hold pauses tp's partition at tp's letter, which the full index
// refused; nothing after it is committed, so nothing is lost.
func (c *Consumer) hold(kc *kafka.Consumer, tp kafka.TopicPartition, held map[int32]kafka.TopicPartition) {
	tps := []kafka.TopicPartition{tp}
	if err := kc.Pause(tps); err != nil {
		c.log.Warn("dlq consumer: pause", zap.Error(err))
	}
	if err := kc.Seek(tp, 1000); err != nil {
		c.log.Warn("dlq consumer: seek back to the refused letter", zap.Error(err))
	}
	if len(held) == 0 {
		c.log.Error("DLQ index full (dlq_index.max_entries): new dead letters wait in the DLQ topic until expiry or a purge makes room",
			zap.Int32("partition", tp.Partition), zap.Int64("offset", int64(tp.Offset)))
	}
	held[tp.Partition] = tp
	c.m.indexFull.Set(1)
}

// release resumes the held partitions once the index has room again.
func (c *Consumer) release(ctx context.Context, kc *kafka.Consumer, held map[int32]kafka.TopicPartition) {
	if len(held) == 0 {
		return
	}
	room, err := c.idx.Room(ctx)
	if err != nil || !room {
		return
	}
	tps := make([]kafka.TopicPartition, 0, len(held))
	for _, tp := range held {
		tps = append(tps, tp)
	}
	if err := kc.Resume(tps); err != nil {
		c.log.Warn("dlq consumer: resume", zap.Error(err))
		return
	}
	clear(held)
	c.m.indexFull.Set(0)
	c.log.Info("DLQ index has room again; indexing resumed")
}

// applyWithRetry indexes one record, retrying while Redis fails: a record
// is never skipped, and the offset waits. park is Rebuild's (see apply).
func (c *Consumer) applyWithRetry(ctx context.Context, m *kafka.Message, park bool) (IndexResult, error) {
	backoff := 100 * time.Millisecond
	for {
		res, err := c.apply(ctx, m, park)
		if err == nil {
			return res, nil
		}
		c.log.Warn("indexing dead letter failed; retrying", zap.Int32("partition", m.TopicPartition.Partition),
			zap.Int64("offset", int64(m.TopicPartition.Offset)), zap.Error(err))
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// apply decodes, places and indexes one DLQ record. With park, a new
// entry that would be due is indexed parked (Index.indexParked).
func (c *Consumer) apply(ctx context.Context, m *kafka.Message, park bool) (IndexResult, error) {
	dl, err := letterFromRecord(m)
	at := Coord{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset)}
	if err != nil {
		// Never crash, never skip: the raw bytes stay for an operator.
		c.m.undecodable.Inc()
		c.log.Error("undecodable DLQ record; indexed for manual review",
			zap.Int32("partition", at.Partition), zap.Int64("offset", at.Offset), zap.Error(err))
	}
	if dl.Event != "" {
		return c.idx.Index(ctx, dl, at)
	}
	dl.EnsureID()
	c.policy.Place(ctx, dl)
	index := c.idx.Index
	if park {
		index = c.idx.indexParked
	}
	res, err := index(ctx, dl, at)
	if err != nil {
		return res, err
	}
	if (res == IndexNew || res == IndexUpdated) && dl.ManualReview {
		c.m.unrecoverable.Inc()
	}
	return res, nil
}

// Rebuild resets the index and re-reads the DLQ topic from the beginning
// up to the high watermark seen at the start (a throw-away group; no
// commits). It may run while Run and the scheduler are running: both index
// idempotently, and the dead letters it indexes stay parked (not due) until
// the whole topic was read — a letter's retried, moved or purged event can
// come many records after it, and a scheduler that found it due before
// that would re-send a letter already retried (a second effect once its
// dedup mark has expired), or one an operator moved to review or purged.
// A rebuild that does not finish leaves letters parked: run it again. It
// returns how many records it applied.
func (c *Consumer) Rebuild(ctx context.Context) (int, error) {
	if err := c.idx.Reset(ctx); err != nil {
		return 0, err
	}
	topic := c.cfg.Kafka.Topics.DLQ.Name
	cm := kafkaclient.Consumer(c.cfg.Kafka, c.cfg.Kafka.Consumer.GroupID+"-rebuild-"+uuid.NewString())
	// The end of a partition may be a transaction's commit marker, never
	// delivered as a record: its end-of-partition event says it was read.
	_ = cm.SetKey("enable.partition.eof", true)
	kc, err := kafka.NewConsumer(cm)
	if err != nil {
		return 0, fmt.Errorf("dlq rebuild: %w", err)
	}
	defer kc.Close()
	md, err := kc.GetMetadata(&topic, false, 10000)
	if err != nil {
		return 0, fmt.Errorf("dlq rebuild metadata: %w", err)
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() != kafka.ErrNoError {
		return 0, fmt.Errorf("dlq rebuild: topic %s: %v", topic, tm.Error)
	}
	high := map[int32]int64{}
	var assign []kafka.TopicPartition
	for _, p := range tm.Partitions {
		lo, hi, err := kc.QueryWatermarkOffsets(topic, p.ID, 10000)
		if err != nil {
			return 0, fmt.Errorf("dlq rebuild watermarks: %w", err)
		}
		if hi > lo {
			high[p.ID] = hi
			assign = append(assign, kafka.TopicPartition{Topic: &topic, Partition: p.ID, Offset: kafka.OffsetBeginning})
		}
	}
	if len(assign) == 0 {
		return 0, nil
	}
	if err := kc.Assign(assign); err != nil {
		return 0, fmt.Errorf("dlq rebuild assign: %w", err)
	}
	n := 0
	for len(high) > 0 {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		switch e := kc.Poll(100).(type) {
		case *kafka.Message:
			p, off := e.TopicPartition.Partition, int64(e.TopicPartition.Offset)
			if hi, ok := high[p]; !ok || off >= hi {
				continue // written after the rebuild began: Run indexes it
			}
			res, err := c.applyWithRetry(ctx, e, true)
			if err != nil {
				return n, err
			}
			if res == IndexFull {
				return n, fmt.Errorf("dlq rebuild: the index is full (dlq_index.max_entries) at %s/%d offset %d: raise the limit or purge, then rebuild again",
					topic, p, off)
			}
			n++
			if off+1 >= high[p] {
				delete(high, p)
			}
		case kafka.PartitionEOF:
			if hi, ok := high[e.Partition]; ok && int64(e.Offset) >= hi {
				delete(high, e.Partition)
			}
		case kafka.Error:
			c.log.Warn("dlq rebuild consumer error", zap.Error(e))
		}
	}
	if _, err := c.idx.unpark(ctx); err != nil {
		return n, err
	}
	return n, nil
}
