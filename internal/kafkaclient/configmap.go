// Package kafkaclient builds confluent-kafka-go clients from configuration
// and bootstraps the pipeline's topics. The safety settings that the
// invariants depend on (acks=all and idempotence for I1, manual commits and
// read_committed for I2) are fixed here and cannot be configured away.
package kafkaclient

import (
	"strconv"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/config"
)

// Producer returns the ConfigMap for every producer of the pipeline.
func Producer(k config.Kafka) *kafka.ConfigMap {
	p := k.Producer
	m := kafka.ConfigMap{
		"bootstrap.servers":            k.Brokers,
		"client.id":                    k.ClientID,
		"acks":                         "all",
		"enable.idempotence":           true,
		"compression.type":             p.Compression,
		"linger.ms":                    p.LingerMs,
		"batch.size":                   p.BatchSize,
		"queue.buffering.max.messages": p.QueueMaxMsgs,
		"delivery.timeout.ms":          int(p.DeliveryTimeout.Milliseconds()),
		// murmur2 places a key where the Java client does, so other clients
		// of the topic agree on a user's partition (I4).
		"partitioner": "murmur2_random",
		// Only the fields we read in delivery reports.
		"go.delivery.report.fields": "key,headers",
	}
	return apply(m, k.Overrides)
}

// Consumer returns the ConfigMap for a consumer in group.
func Consumer(k config.Kafka, group string) *kafka.ConfigMap {
	c := k.Consumer
	m := kafka.ConfigMap{
		"bootstrap.servers":             k.Brokers,
		"client.id":                     k.ClientID,
		"group.id":                      group,
		"partition.assignment.strategy": "cooperative-sticky",
		"enable.auto.commit":            false,
		// Offsets are stored only by the offset tracker's commits.
		"enable.auto.offset.store": false,
		"isolation.level":          "read_committed",
		"auto.offset.reset":        c.AutoOffsetReset,
		"session.timeout.ms":       int(c.SessionTimeout.Milliseconds()),
		"max.poll.interval.ms":     int(c.MaxPollInterval.Milliseconds()),
		"fetch.max.bytes":          c.FetchMaxBytes,
		"go.logs.channel.enable":   false,
	}
	if c.HeartbeatInterval > 0 {
		// librdkafka's default is 3 s: each rebalance of a rolling restart
		// waited up to that for the members to notice it.
		m["heartbeat.interval.ms"] = int(c.HeartbeatInterval.Milliseconds())
	}
	return apply(m, k.Overrides)
}

// Admin returns the ConfigMap for an AdminClient.
func Admin(k config.Kafka) *kafka.ConfigMap {
	return apply(kafka.ConfigMap{"bootstrap.servers": k.Brokers, "client.id": k.ClientID + "-admin"}, k.Overrides)
}

// fixed are the properties overrides may not change.
var fixed = map[string]bool{
	"acks": true, "enable.idempotence": true, "enable.auto.commit": true,
	"isolation.level": true, "enable.auto.offset.store": true,
}

func apply(m kafka.ConfigMap, overrides map[string]string) *kafka.ConfigMap {
	for k, v := range overrides {
		if fixed[k] {
			continue
		}
		m[k] = v
	}
	return &m
}

// itoa is used for topic config values, which the AdminClient wants as strings.
func itoa(i int) string { return strconv.Itoa(i) }
