package kafkaclient

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/config"
)

// ErrPartitionMismatch is returned by Bootstrap when an existing topic has a
// different partition count than configured: keys would map to other
// partitions than the running system expects, so we refuse to start.
var ErrPartitionMismatch = errors.New("topic partition count differs from config")

// Spec turns a configured topic into an AdminClient specification.
func Spec(t config.Topic) kafka.TopicSpecification {
	return kafka.TopicSpecification{
		Topic:             t.Name,
		NumPartitions:     t.Partitions,
		ReplicationFactor: t.ReplicationFactor,
		Config: map[string]string{
			"min.insync.replicas": itoa(t.MinInsyncReplicas),
			"retention.ms":        strconv.FormatInt(t.RetentionMs, 10),
			"compression.type":    t.CompressionType,
			"max.message.bytes":   itoa(t.MaxMessageBytes),
		},
	}
}

// Bootstrap creates each topic that is missing with its configured
// settings, and checks that existing ones have the configured partition
// count. It is safe to run from several daemons at once.
func Bootstrap(ctx context.Context, admin *kafka.AdminClient, topics ...config.Topic) error {
	md, err := admin.GetMetadata(nil, true, timeoutMs(ctx, 10*time.Second))
	if err != nil {
		return fmt.Errorf("bootstrap topics: metadata: %w", err)
	}
	var create []kafka.TopicSpecification
	for _, t := range topics {
		if tm, ok := md.Topics[t.Name]; ok && tm.Error.Code() == kafka.ErrNoError {
			if len(tm.Partitions) != t.Partitions {
				return fmt.Errorf("%w: topic %s has %d partitions, config says %d (kafka.topics.*.partitions)",
					ErrPartitionMismatch, t.Name, len(tm.Partitions), t.Partitions)
			}
			continue
		}
		create = append(create, Spec(t))
	}
	if len(create) == 0 {
		return nil
	}
	res, err := admin.CreateTopics(ctx, create, kafka.SetAdminOperationTimeout(30*time.Second))
	if err != nil {
		return fmt.Errorf("bootstrap topics: create: %w", err)
	}
	for _, r := range res {
		switch r.Error.Code() {
		case kafka.ErrNoError, kafka.ErrTopicAlreadyExists:
		default:
			return fmt.Errorf("bootstrap topics: create %s: %w", r.Topic, r.Error)
		}
	}
	// A concurrent creator may have won with other settings; re-check.
	for _, t := range topics {
		if err := waitPartitions(ctx, admin, t); err != nil {
			return err
		}
	}
	return nil
}

func waitPartitions(ctx context.Context, admin *kafka.AdminClient, t config.Topic) error {
	for {
		md, err := admin.GetMetadata(&t.Name, false, timeoutMs(ctx, 5*time.Second))
		if err == nil {
			if tm, ok := md.Topics[t.Name]; ok && tm.Error.Code() == kafka.ErrNoError && len(tm.Partitions) > 0 {
				if len(tm.Partitions) != t.Partitions {
					return fmt.Errorf("%w: topic %s has %d partitions, config says %d",
						ErrPartitionMismatch, t.Name, len(tm.Partitions), t.Partitions)
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bootstrap topics: %s not visible: %w", t.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Ping asks the cluster for metadata: the readiness check for Kafka.
func Ping(ctx context.Context, admin *kafka.AdminClient) error {
	md, err := admin.GetMetadata(nil, false, timeoutMs(ctx, 2*time.Second))
	if err != nil {
		return err
	}
	if len(md.Brokers) == 0 {
		return errors.New("no brokers in metadata")
	}
	return nil
}

func timeoutMs(ctx context.Context, def time.Duration) int {
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < def {
			def = d
		}
	}
	if def < 100*time.Millisecond {
		def = 100 * time.Millisecond
	}
	return int(def.Milliseconds())
}
