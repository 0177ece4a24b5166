package testenv

import (
	"errors"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// ReadTopic reads every record of topic, from the beginning up to the high
// watermarks taken when called, with a plain assign-based consumer (no
// group offsets are committed). It fails the test when the records do not
// arrive within a minute.
func ReadTopic(t testing.TB, brokers, topic string) []*kafka.Message {
	t.Helper()
	c, want, total := assignFromStart(t, brokers, topic, true)
	defer c.Close()
	out := make([]*kafka.Message, 0, total)
	deadline := time.Now().Add(60 * time.Second)
	for len(want) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("reading %s: %d records read, partitions not finished: %v", topic, len(out), want)
		}
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			var ke kafka.Error
			if errors.As(err, &ke) && ke.Code() == kafka.ErrTimedOut {
				continue
			}
			t.Fatal(err)
		}
		out = append(out, m)
		if hw, ok := want[m.TopicPartition.Partition]; ok && int64(m.TopicPartition.Offset) >= hw-1 {
			delete(want, m.TopicPartition.Partition)
		}
	}
	return out
}

// ReadTopicAtLeast reads every partition of topic from the beginning until
// n records arrived (records still being written are waited for, up to
// 20 s), then keeps reading for linger to catch extras that should not be
// there.
func ReadTopicAtLeast(t testing.TB, brokers, topic string, n int, linger time.Duration) []*kafka.Message {
	t.Helper()
	c, _, _ := assignFromStart(t, brokers, topic, false)
	defer c.Close()
	var out []*kafka.Message
	deadline := time.Now().Add(20 * time.Second)
	var until time.Time
	for time.Now().Before(deadline) {
		if len(out) >= n && until.IsZero() {
			until = time.Now().Add(linger)
		}
		if !until.IsZero() && time.Now().After(until) {
			break
		}
		if m, ok := c.Poll(50).(*kafka.Message); ok {
			out = append(out, m)
		}
	}
	if len(out) < n {
		t.Fatalf("read %d records from %s, want %d", len(out), topic, n)
	}
	return out
}

// assignFromStart returns a consumer assigned to every partition of topic
// at the beginning (the caller closes it); with watermarks it also returns the
// high watermark of every non-empty partition and their sum.
func assignFromStart(t testing.TB, brokers, topic string, watermarks bool) (*kafka.Consumer, map[int32]int64, int64) {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": Name(t, "read"),
		"enable.auto.commit": false, "auto.offset.reset": "earliest", "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		_ = c.Close()
		t.Fatal(err)
	}
	var tps []kafka.TopicPartition
	want := map[int32]int64{}
	var total int64
	for _, p := range md.Topics[topic].Partitions {
		if watermarks {
			_, high, err := c.QueryWatermarkOffsets(topic, p.ID, 10000)
			if err != nil {
				_ = c.Close()
				t.Fatal(err)
			}
			if high > 0 {
				want[p.ID] = high
				total += high
			}
		}
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p.ID, Offset: kafka.OffsetBeginning})
	}
	if err := c.Assign(tps); err != nil {
		_ = c.Close()
		t.Fatal(err)
	}
	return c, want, total
}

// Header returns the value of m's header key, or "" when m has none.
func Header(m *kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
