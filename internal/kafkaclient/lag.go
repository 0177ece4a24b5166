package kafkaclient

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/config"
)

// PartitionLag is one partition of a topic as a consumer group sees it.
type PartitionLag struct {
	Partition int32
	// End is the partition's last stable offset (read_committed: a
	// transaction still open is not counted yet).
	End int64
	// Committed is the group's committed offset, -1 when it has none.
	Committed int64
	// Lag is End - Committed (End when nothing is committed: the group
	// would read from the start).
	Lag int64
}

// GroupReader returns a consumer handle of group that never joins it (it
// subscribes to nothing and commits nothing): GroupLag reads the group's
// committed offsets through it.
func GroupReader(k config.Kafka, group string) (*kafka.Consumer, error) {
	m := Consumer(k, group)
	_ = m.SetKey("client.id", k.ClientID+"-lag")
	return kafka.NewConsumer(m)
}

// GroupLag returns, for every partition of topic, its end offset, the
// committed offset of the group reader's group and the lag between them:
// the admin API's overview.
//
// The committed offsets are read through a consumer handle of the group
// (GroupReader), not with the admin client's ListConsumerGroupOffsets: when
// the group's coordinator answers NOT_COORDINATOR (it moves, or is still
// loading, as while a broker restarts), librdkafka hands that answer to the
// consumer group of the handle that asked, and an admin client has none: the
// process dies of a segmentation fault (seen in the chaos suite's broker
// kills; the same librdkafka fault is reported against its JavaScript
// client, confluent-kafka-javascript#374). A consumer handle has its group.
func GroupLag(ctx context.Context, admin *kafka.AdminClient, group *kafka.Consumer, topic string) ([]PartitionLag, error) {
	md, err := admin.GetMetadata(&topic, false, timeoutMs(ctx, 5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() != kafka.ErrNoError {
		return nil, fmt.Errorf("metadata of %s: %v", topic, tm.Error)
	}
	tps := make([]kafka.TopicPartition, 0, len(tm.Partitions))
	specs := make(map[kafka.TopicPartition]kafka.OffsetSpec, len(tm.Partitions))
	for _, p := range tm.Partitions {
		tp := kafka.TopicPartition{Topic: &topic, Partition: p.ID}
		tps = append(tps, tp)
		specs[tp] = kafka.LatestOffsetSpec
	}
	ends, err := admin.ListOffsets(ctx, specs, kafka.SetAdminIsolationLevel(kafka.IsolationLevelReadCommitted))
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	committed, err := group.Committed(tps, timeoutMs(ctx, 5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", topic, err)
	}
	byPart := map[int32]int64{}
	for _, tp := range committed {
		if tp.Error == nil && tp.Offset >= 0 {
			byPart[tp.Partition] = int64(tp.Offset)
		}
	}
	out := make([]PartitionLag, 0, len(tps))
	for tp, info := range ends.ResultInfos {
		if info.Error.Code() != kafka.ErrNoError {
			return nil, fmt.Errorf("end offset of %s/%d: %v", topic, tp.Partition, info.Error)
		}
		pl := PartitionLag{Partition: tp.Partition, End: int64(info.Offset), Committed: -1}
		if c, ok := byPart[tp.Partition]; ok {
			pl.Committed = c
			pl.Lag = max(pl.End-c, 0)
		} else {
			pl.Lag = pl.End
		}
		out = append(out, pl)
	}
	slices.SortFunc(out, func(a, b PartitionLag) int { return int(a.Partition - b.Partition) })
	return out, nil
}
