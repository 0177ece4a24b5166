package bench

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/producer"
)

// Record is a main-topic record exactly as the producer writes it: key =
// external_userid, ChatMessage JSON, the five headers.
func Record(topic string, m *chatmsg.ChatMessage) *kafka.Message {
	v, err := chatmsg.Encode(m)
	if err != nil {
		panic(err) // ChatMessage always encodes
	}
	hs := m.Headers()
	headers := make([]kafka.Header, len(hs))
	for i, h := range hs {
		headers[i] = kafka.Header{Key: h[0], Value: []byte(h[1])}
	}
	return &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key: []byte(m.ExternalUserID), Value: v, Headers: headers}
}

// RawProducer is a plain librdkafka producer with the pipeline's ConfigMap
// (kafkaclient.Producer) and a delivery-report reader.
type RawProducer struct {
	P         *kafka.Producer
	wg        sync.WaitGroup
	mu        sync.Mutex
	delivered int
	failed    int
	// OnDelivery, when set before the first Produce, is called for every
	// successful report (from the reader goroutine).
	OnDelivery func(m *kafka.Message)
	// stats is librdkafka's latest statistics report (newWarmRawProducer).
	stats atomic.Pointer[string]
}

// NewRawProducer builds the producer from cfg.
func NewRawProducer(cfg config.Kafka) (*RawProducer, error) { return newRawProducer(cfg, false) }

// newWarmRawProducer is NewRawProducer with librdkafka's statistics on at
// the interval producer.KafkaProducer uses, so that WaitWarm can tell when
// it is warm.
func newWarmRawProducer(cfg config.Kafka) (*RawProducer, error) { return newRawProducer(cfg, true) }

func newRawProducer(cfg config.Kafka, stats bool) (*RawProducer, error) {
	cm := kafkaclient.Producer(cfg)
	_ = cm.SetKey("go.delivery.report.fields", "none")
	if stats {
		_ = cm.SetKey("statistics.interval.ms", int(producer.StatsInterval.Milliseconds()))
	}
	p, err := kafka.NewProducer(cm)
	if err != nil {
		return nil, fmt.Errorf("raw producer: %w", err)
	}
	r := &RawProducer{P: p}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for ev := range p.Events() {
			if st, ok := ev.(*kafka.Stats); ok {
				s := st.String()
				r.stats.Store(&s)
				continue
			}
			m, ok := ev.(*kafka.Message)
			if !ok {
				continue
			}
			r.mu.Lock()
			if m.TopicPartition.Error != nil {
				r.failed++
			} else {
				r.delivered++
			}
			r.mu.Unlock()
			if m.TopicPartition.Error == nil && r.OnDelivery != nil {
				r.OnDelivery(m)
			}
		}
	}()
	return r, nil
}

// Produce enqueues m, waiting while librdkafka's queue is full.
func (r *RawProducer) Produce(m *kafka.Message) error {
	for {
		err := r.P.Produce(m, nil)
		if err == nil {
			return nil
		}
		var ke kafka.Error
		if !errors.As(err, &ke) || ke.Code() != kafka.ErrQueueFull {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Wait waits until n reports arrived (or limit passes) and returns an error
// if any failed.
func (r *RawProducer) Wait(n int, limit time.Duration) error {
	ok := waitUntil(limit, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.delivered+r.failed >= n
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		return fmt.Errorf("raw producer: %d of %d reports after %s", r.delivered+r.failed, n, limit)
	}
	if r.failed > 0 {
		return fmt.Errorf("raw producer: %d delivery failures", r.failed)
	}
	return nil
}

// WaitWarm waits until the producer (built by newWarmRawProducer) is
// warm as producer.KafkaProducer.WaitReady defines it: its idempotent
// producer ID assigned and the leaders of topic's partitions known.
func (r *RawProducer) WaitWarm(topic string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var parts int
	for parts == 0 {
		md, err := r.P.GetMetadata(&topic, false, 1000)
		if err == nil && md.Topics[topic].Error.Code() == kafka.ErrNoError {
			parts = len(md.Topics[topic].Partitions)
		}
		if parts == 0 && time.Now().After(deadline) {
			return fmt.Errorf("raw producer: no metadata for %s after %s: %v", topic, limit, err)
		}
	}
	reason := "no statistics yet"
	if !waitUntil(time.Until(deadline), func() bool {
		if s := r.stats.Load(); s != nil {
			reason = producer.StatsNotReady(*s, topic, parts)
			return reason == ""
		}
		return false
	}) {
		return fmt.Errorf("raw producer not warm after %s: %s", limit, reason)
	}
	return nil
}

// Close flushes and closes the producer.
func (r *RawProducer) Close() {
	r.P.Flush(10000)
	r.P.Close()
	r.wg.Wait()
}

// rawProduceRate produces msgs (already built, all to one topic) and
// returns msgs/s from when the producer is warm (WaitWarm, the same
// condition as KafkaProducer.WaitReady) to the last delivery report, and
// how long the warm-up took.
func rawProduceRate(cfg config.Kafka, msgs []*kafka.Message) (rate float64, warm time.Duration, err error) {
	r, err := newWarmRawProducer(cfg)
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	created := time.Now()
	if err := r.WaitWarm(*msgs[0].TopicPartition.Topic, 30*time.Second); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	warm = start.Sub(created)
	for _, m := range msgs {
		if err := r.Produce(m); err != nil {
			return 0, 0, err
		}
	}
	if err := r.Wait(len(msgs), 2*time.Minute); err != nil {
		return 0, 0, err
	}
	return float64(len(msgs)) / time.Since(start).Seconds(), warm, nil
}

// Prefill writes msgs to topic with a raw producer.
func Prefill(cfg config.Kafka, topic string, msgs []*chatmsg.ChatMessage) error {
	r, err := NewRawProducer(cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	now := time.Now().UnixMilli()
	for _, m := range msgs {
		m.ProducedAt = now
		if err := r.Produce(Record(topic, m)); err != nil {
			return err
		}
	}
	return r.Wait(len(msgs), 3*time.Minute)
}

// rawConsume reads n records of topic with a plain ReadMessage loop and
// the consumer's ConfigMap, and returns msgs/s from subscribe to the n-th
// record.
func rawConsume(cfg config.Kafka, group, topic string, n int, limit time.Duration) (fromStart, fromFirst float64, err error) {
	c, err := kafka.NewConsumer(kafkaclient.Consumer(cfg, group))
	if err != nil {
		return 0, 0, fmt.Errorf("raw consumer: %w", err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.Subscribe(topic, nil); err != nil {
		return 0, 0, err
	}
	got := 0
	var first time.Time
	deadline := start.Add(limit)
	for got < n {
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("raw consumer: %d of %d records after %s", got, n, limit)
		}
		m, err := c.ReadMessage(100 * time.Millisecond)
		if err != nil {
			var ke kafka.Error
			if errors.As(err, &ke) && ke.IsTimeout() {
				continue
			}
			return 0, 0, err
		}
		if m.TopicPartition.Error == nil {
			if got == 0 {
				first = time.Now()
			}
			got++
		}
	}
	end := time.Now()
	return float64(n) / end.Sub(start).Seconds(), float64(n) / end.Sub(first).Seconds(), nil
}

// rawLatency consumes topic with a raw ReadMessage loop and records, for
// every record, now − the ProducedAt header value (the "timestamp" header,
// Unix ms) until stop is closed.
func rawLatencyConsumer(cfg config.Kafka, group, topic string, lat *Latencies, stop <-chan struct{}, ready chan<- struct{}) error {
	c, err := kafka.NewConsumer(kafkaclient.Consumer(cfg, group))
	if err != nil {
		return fmt.Errorf("raw consumer: %w", err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		return err
	}
	readyOnce := sync.OnceFunc(func() { close(ready) })
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		m, err := c.ReadMessage(50 * time.Millisecond)
		if err != nil {
			if a, aerr := c.Assignment(); aerr == nil && len(a) > 0 {
				readyOnce()
			}
			continue
		}
		readyOnce()
		for _, h := range m.Headers {
			if h.Key == chatmsg.HeaderTimestamp {
				if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil && ms > 0 {
					lat.Add(float64(time.Now().UnixMicro()-ms*1000) / 1000)
				}
			}
		}
	}
}
