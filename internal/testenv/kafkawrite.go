package testenv

import (
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Record is one record for Produce.
type Record struct {
	Key, Value []byte
	Headers    [][2]string
}

// Produce writes recs to topic in order, as kf-producer does (idempotent,
// acks=all, murmur2 partitioning by key), and waits for every delivery.
func Produce(t testing.TB, brokers, topic string, recs []Record) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "acks": "all",
		"enable.idempotence": true, "linger.ms": 5, "partitioner": "murmur2_random"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dr := make(chan kafka.Event, len(recs))
	for _, r := range recs {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h[0], Value: []byte(h[1])})
		}
		for {
			err := p.Produce(m, dr)
			if err == nil {
				break
			}
			if kerr, ok := err.(kafka.Error); ok && kerr.Code() == kafka.ErrQueueFull {
				p.Flush(100)
				continue
			}
			t.Fatalf("produce: %v", err)
		}
	}
	for range recs {
		if m := (<-dr).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatalf("delivery: %v", m.TopicPartition.Error)
		}
	}
}
