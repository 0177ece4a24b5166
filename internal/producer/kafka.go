package producer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// queueFullWait is how long ProduceBatch waits before retrying a message
// that librdkafka refused with ErrQueueFull. Delivery reports are served by
// the producer's own poller, so the queue drains while we sleep.
const queueFullWait = 2 * time.Millisecond

// KafkaProducer sends ChatMessages to Kafka asynchronously (librdkafka
// batches and compresses them) and lets a caller wait for the delivery
// reports of exactly the messages it produced: the sync loop advances a
// cursor only after every message of the page is acknowledged (I1).
type KafkaProducer struct {
	p   *kafka.Producer
	log *zap.Logger
	m   kafkaMetrics

	// readers are the delivery-report and log readers; they return when
	// p.Close closes the Events and Logs channels.
	readers   sync.WaitGroup
	closeOnce sync.Once
	closed    atomic.Bool
	// closing is closed when Close starts; bg (the warm-up's metadata
	// requests) is waited for before p.Close.
	closing chan struct{}
	bg      sync.WaitGroup

	warm *warmup

	fatal atomic.Pointer[kafka.Error]

	// stale are batches whose caller stopped waiting before every report
	// came back: their messages are still queued in librdkafka, where
	// they stay until delivered (they never time out). ProduceBatch waits
	// for them before it sends anything, so a page sent again follows its
	// earlier copy instead of being queued beside it.
	staleMu sync.Mutex
	stale   []*batch
}

type kafkaMetrics struct {
	produced prometheus.Counter
	errors   prometheus.Counter
	latency  prometheus.Histogram
	stale    prometheus.Gauge
}

func newKafkaMetrics(reg prometheus.Registerer) kafkaMetrics {
	m := kafkaMetrics{
		produced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_produced_total",
			Help: "Messages acknowledged by Kafka (acks=all).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_produce_errors_total",
			Help: "Messages whose produce call or delivery report failed.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kfpipe_produce_latency_seconds",
			Help:    "Time from handing a message to librdkafka to its successful delivery report.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_produce_stale_batches",
			Help: "Batches whose caller stopped waiting while some of their messages were still queued; new batches wait for them.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.produced, m.errors, m.latency, m.stale)
	}
	return m
}

// NewKafkaProducer builds the producer from cfg with the pipeline's fixed
// safety settings (kafkaclient.Producer: acks=all, idempotence, lz4,
// murmur2_random). reg may be nil (metrics not registered), logger may be
// nil.
//
// The producer warms up in the background: it is not Ready, and WaitReady
// blocks, until its idempotent producer ID is assigned and the leaders of
// cfg.Topics.Main's partitions (when named) are known.
// ProduceBatch works before that, but its messages wait for all of it.
func NewKafkaProducer(cfg config.Kafka, reg prometheus.Registerer, logger *zap.Logger) (*KafkaProducer, error) {
	cm, err := producerConfig(cfg)
	if err != nil {
		return nil, err
	}
	return newKafkaProducer(cm, cfg.Topics.Main.Name, reg, logger)
}

// producerConfig is kafkaclient.Producer plus what this wrapper relies on.
func producerConfig(cfg config.Kafka) (*kafka.ConfigMap, error) {
	cm := kafkaclient.Producer(cfg)
	// Reports are routed by Opaque alone; copying key, value and headers
	// back into Go for each of them is wasted work on the hot path.
	if err := cm.SetKey("go.delivery.report.fields", "none"); err != nil {
		return nil, fmt.Errorf("kafka producer config: %w", err)
	}
	// librdkafka's own log lines go to zap rather than to stderr.
	if err := cm.SetKey("go.logs.channel.enable", true); err != nil {
		return nil, fmt.Errorf("kafka producer config: %w", err)
	}
	// A message is never failed for taking too long (0: no timeout), so a
	// page is never delivered with a hole in it. With a timeout, librdkafka
	// fails the messages queued first once it passes and delivers the rest
	// when the broker is back; the page's re-send then brings a user's
	// earlier message after a later one (I4). How long a caller waits is
	// its context's business (sync.delivery_wait); ProduceBatch does not
	// send again while an earlier batch is still queued (see stale).
	delete(*cm, "delivery.timeout.ms")
	delete(*cm, "message.timeout.ms")
	if err := cm.SetKey("message.timeout.ms", 0); err != nil {
		return nil, fmt.Errorf("kafka producer config: %w", err)
	}
	// The warm-up reads the idempotent producer's state from the
	// statistics; an override may make them more frequent, not disable them.
	if v, _ := cm.Get("statistics.interval.ms", 0); toInt(v) <= 0 {
		if err := cm.SetKey("statistics.interval.ms", int(StatsInterval.Milliseconds())); err != nil {
			return nil, fmt.Errorf("kafka producer config: %w", err)
		}
	}
	return cm, nil
}

func newKafkaProducer(cm *kafka.ConfigMap, topic string, reg prometheus.Registerer, logger *zap.Logger) (*KafkaProducer, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	w := newWarmup(topic)
	p, err := kafka.NewProducer(cm)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	kp := &KafkaProducer{p: p, log: logger, m: newKafkaMetrics(reg), closing: make(chan struct{}), warm: w}
	kp.readers.Add(1)
	go kp.readEvents()
	if logs := p.Logs(); logs != nil {
		kp.readers.Add(1)
		go kp.readLogs(logs)
	}
	if topic != "" {
		kp.bg.Add(1)
		go kp.fetchTopic()
	}
	return kp, nil
}

// toInt reads a ConfigMap value that may be a number or a string.
func toInt(v kafka.ConfigValue) int {
	switch x := v.(type) {
	case int:
		return x
	case string:
		n, _ := strconv.Atoi(x)
		return n
	}
	return 0
}

// readLogs forwards librdkafka's log lines (syslog levels) to zap.
func (kp *KafkaProducer) readLogs(logs chan kafka.LogEvent) {
	defer kp.readers.Done()
	for e := range logs {
		fields := []zap.Field{zap.String("facility", e.Tag), zap.String("client", e.Name)}
		switch {
		case e.Level <= 3:
			kp.log.Error("librdkafka: "+e.Message, fields...)
		case e.Level == 4:
			kp.log.Warn("librdkafka: "+e.Message, fields...)
		default:
			kp.log.Debug("librdkafka: "+e.Message, fields...)
		}
	}
}

// batch tracks the delivery reports of one ProduceBatch call.
type batch struct {
	// entries holds one element per message; each message's Opaque points at
	// its element, so routing a report costs no allocation per message.
	entries []inflight
	pending atomic.Int64
	done    chan struct{}

	mu  sync.Mutex
	err error // first failure
}

// inflight is the Opaque of one produced message.
type inflight struct {
	b    *batch
	sent time.Time
}

func newBatch(n int) *batch {
	b := &batch{entries: make([]inflight, n), done: make(chan struct{})}
	b.pending.Store(int64(n))
	if n == 0 {
		close(b.done)
	}
	return b
}

// settle accounts for n messages, recording err when it is the first.
func (b *batch) settle(n int, err error) {
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	if b.pending.Add(int64(-n)) == 0 {
		close(b.done)
	}
}

func (b *batch) result() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// readEvents is the only reader of the Events channel; it ends when Close
// closes the producer. A fatal error is kept for the next ProduceBatch.
func (kp *KafkaProducer) readEvents() {
	defer kp.readers.Done()
	kafkaclient.DrainEvents(kp.p.Events(), kafkaclient.Events[*inflight]{
		Delivered: kp.delivered, Stats: kp.onStats, Fatal: func(e kafka.Error) { kp.fatal.Store(&e) },
		Log: kp.log, ErrorLevel: zap.WarnLevel, Name: "kafka producer"})
}

// delivered settles one record of its batch by its delivery report.
func (kp *KafkaProducer) delivered(f *inflight, err error) {
	if err != nil {
		kp.m.errors.Inc()
		f.b.settle(1, fmt.Errorf("%w: %w", ErrDelivery, err))
		return
	}
	kp.m.produced.Inc()
	kp.m.latency.Observe(time.Since(f.sent).Seconds())
	f.b.settle(1, nil)
}

// ProduceBatch hands every message to librdkafka without waiting for any
// single one (keyed by external_userid, headers from ChatMessage.Headers,
// ProducedAt set), then waits for the delivery reports of these messages
// only. It returns nil when every message is acknowledged; otherwise an
// error wrapping ErrDelivery (a report failed), the produce error, or ctx's
// error. On error some messages may still be delivered later: the caller
// re-produces the batch and the consumer drops the duplicates (I3).
//
// A message is never failed for being slow: when ctx ends first, the
// batch stays queued and is delivered once the broker takes it, and every
// later call waits (within its own ctx) until it is, before sending
// anything. So a batch sent again comes after all of its earlier copy,
// and a user's messages are first seen in order (I4).
//
// Concurrent calls are safe. Within one call, messages of one key are
// produced in slice order, and the idempotent producer keeps that order.
func (kp *KafkaProducer) ProduceBatch(ctx context.Context, topic string, msgs []*chatmsg.ChatMessage) error {
	if kp.closed.Load() {
		return ErrClosed
	}
	if err := kp.waitStale(ctx); err != nil {
		return err
	}
	b := newBatch(len(msgs))
	now := time.Now()
	producedAt := now.UnixMilli()
	for i, m := range msgs {
		m.ProducedAt = producedAt
		km, err := kafkaMessage(topic, m)
		if err == nil {
			b.entries[i] = inflight{b: b, sent: now}
			km.Opaque = &b.entries[i]
			err = kp.produce(ctx, km)
		}
		if err != nil {
			// The rest of the batch is not sent; the batch fails as a whole.
			kp.m.errors.Add(float64(len(msgs) - i))
			b.settle(len(msgs)-i, err)
			break
		}
	}
	select {
	case <-b.done:
		return b.result()
	case <-ctx.Done():
		kp.staleMu.Lock()
		kp.stale = append(kp.stale, b)
		kp.m.stale.Set(float64(len(kp.stale)))
		kp.staleMu.Unlock()
		return fmt.Errorf("waiting for delivery reports: %w", ctx.Err())
	}
}

// waitStale returns once every stale batch has all its reports, or with
// ctx's error.
func (kp *KafkaProducer) waitStale(ctx context.Context) error {
	for {
		kp.staleMu.Lock()
		kp.stale = slices.DeleteFunc(kp.stale, func(b *batch) bool {
			select {
			case <-b.done:
				return true
			default:
				return false
			}
		})
		kp.m.stale.Set(float64(len(kp.stale)))
		if len(kp.stale) == 0 {
			kp.staleMu.Unlock()
			return nil
		}
		b := kp.stale[0]
		kp.staleMu.Unlock()
		select {
		case <-b.done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for an earlier batch still queued: %w", ctx.Err())
		}
	}
}

// produce enqueues km, waiting while librdkafka's queue is full: a message
// is never dropped for backpressure, the caller just slows down.
func (kp *KafkaProducer) produce(ctx context.Context, km *kafka.Message) error {
	var timer *time.Timer
	for {
		err := kp.p.Produce(km, nil)
		if err == nil {
			return nil
		}
		var ke kafka.Error
		if !errors.As(err, &ke) || ke.Code() != kafka.ErrQueueFull {
			return fmt.Errorf("produce: %w", err)
		}
		if timer == nil {
			timer = time.NewTimer(queueFullWait)
			defer timer.Stop()
		} else {
			timer.Reset(queueFullWait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("produce (queue full): %w", ctx.Err())
		}
	}
}

func kafkaMessage(topic string, m *chatmsg.ChatMessage) (*kafka.Message, error) {
	value, err := chatmsg.Encode(m)
	if err != nil {
		return nil, fmt.Errorf("encode message %s: %w", m.UpstreamMsgID, err)
	}
	hs := m.Headers()
	headers := make([]kafka.Header, len(hs))
	for i, h := range hs {
		headers[i] = kafka.Header{Key: h[0], Value: []byte(h[1])}
	}
	key := m.ExternalUserID
	if key == "" {
		// Events without a user (e.g. servicer status changes) stay in
		// order per open_kfid instead of piling onto the empty key's partition.
		key = m.OpenKfID
	}
	return &kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key:            []byte(key),
		Value:          value,
		Headers:        headers,
	}, nil
}

// Ready reports whether the producer has warmed up (see WaitReady), has no
// fatal error, and the brokers answer a metadata request within ctx's
// deadline (1 s when ctx has none).
func (kp *KafkaProducer) Ready(ctx context.Context) error {
	if kp.closed.Load() {
		return ErrClosed
	}
	if f := kp.fatal.Load(); f != nil {
		return fmt.Errorf("kafka producer fatal error: %w", *f)
	}
	if !kp.warm.warm.Load() {
		return fmt.Errorf("%w: %s", ErrWarmingUp, *kp.warm.reason.Load())
	}
	timeout := time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout < 10*time.Millisecond {
		timeout = 10 * time.Millisecond
	}
	md, err := kp.p.GetMetadata(nil, false, int(timeout.Milliseconds()))
	if err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	if len(md.Brokers) == 0 {
		return errors.New("kafka metadata: no brokers")
	}
	return nil
}

// Close waits until every queued message is delivered or ctx ends; what is
// still queued then is purged (its batches fail, so no cursor advances past
// it), and the producer is closed. Close waits for the report reader.
func (kp *KafkaProducer) Close(ctx context.Context) error {
	var err error
	kp.closeOnce.Do(func() {
		kp.closed.Store(true)
		close(kp.closing)
		for kp.p.Len() > 0 && ctx.Err() == nil {
			kp.p.Flush(100)
		}
		if n := kp.p.Len(); n > 0 {
			err = fmt.Errorf("kafka producer closed with %d messages undelivered", n)
			_ = kp.p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight)
			kp.p.Flush(1000) // serves the purge reports so waiting batches fail
		}
		kp.bg.Wait()
		kp.p.Close()
		kp.readers.Wait()
	})
	return err
}
