package sources

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/producer"
)

// Pipeline gives the admin API's overview what kf-producer published
// (the accounts' sync horizon, in Redis) and the schedule-consumers' lag
// (the group's offsets, from Kafka).
type Pipeline struct {
	state  *producer.RedisState
	kafka  *kafka.AdminClient
	group  *kafka.Consumer // a reader of the schedule-consumers' group (kafkaclient.GroupReader)
	topic  string
	rdb    redis.UniversalClient
	prefix string
	kcfg   config.Kafka // the customer timeline reads the main topic
	// The Kafka card: the groups' names, the DLQ topic and a reader of
	// the dlq-consumers' group.
	groupName, dlqTopic, dlqGroupName string
	dlqGroup                          *kafka.Consumer
	archive                           *archive.Store // nil: the timeline scans the main topic
}

// NewPipeline is the console's view of the pipeline on d's clients (New's,
// or a test's on the clients it has).
func NewPipeline(cfg *config.DLQConsumer, d Deps) Pipeline {
	return Pipeline{state: producer.NewRedisState(d.Redis, cfg.Redis.KeyPrefix), kafka: d.Kafka,
		group: d.Lag, topic: cfg.Kafka.Topics.Main.Name, rdb: d.Redis, prefix: cfg.Redis.KeyPrefix,
		kcfg: cfg.Kafka, groupName: cfg.Admin.ConsumerGroup, dlqTopic: cfg.Kafka.Topics.DLQ.Name,
		dlqGroup: d.DLQLag, dlqGroupName: cfg.Kafka.Consumer.GroupID, archive: d.Archive}
}

func (p Pipeline) Consumers(ctx context.Context) ([]console.ConsumerStatus, error) {
	return consumerStatuses(ctx, p.rdb, p.prefix, time.Now())
}

func (p Pipeline) Accounts(ctx context.Context) ([]console.AccountSync, error) {
	st, err := p.state.SyncStatuses(ctx)
	if err != nil {
		return nil, err
	}
	days, err := readStats(ctx, p.rdb, p.prefix)
	if err != nil {
		return nil, err
	}
	out := make([]console.AccountSync, len(st))
	for i, s := range st {
		a := console.AccountSync{OpenKfID: s.OpenKfID, Reported: s.Reported, Days: days[s.OpenKfID]}
		if !s.LastSuccess.IsZero() {
			a.LastSuccess = &s.LastSuccess
		}
		if !s.OldestWaiting.IsZero() {
			a.OldestWaiting = &s.OldestWaiting
		}
		out[i] = a
	}
	return out, nil
}

func (p Pipeline) Lag(ctx context.Context) ([]console.PartitionLag, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lag, err := kafkaclient.GroupLag(ctx, p.kafka, p.group, p.topic)
	if err != nil {
		return nil, err
	}
	out := make([]console.PartitionLag, len(lag))
	for i, l := range lag {
		out[i] = console.PartitionLag{Partition: l.Partition, End: l.End, Committed: l.Committed, Lag: l.Lag}
	}
	return out, nil
}

// NodeStatusKey is the Redis hash every schedule-consumer publishes its
// status to, one field per process (internal/service writes it).
func NodeStatusKey(prefix string) string { return prefix + "consumer:status" }

// consumerStatuses reads the status hash as fleet.Judge shows it at now:
// stale fields flagged, gone ones left out (and deleted, best effort, so
// the hash does not keep every killed process while others refresh it).
// The overview flags the same fields stale (its own 30 s, fleet.StaleAfter)
// and leaves them out of its totals.
func consumerStatuses(ctx context.Context, rdb redis.UniversalClient, prefix string, now time.Time) ([]console.ConsumerStatus, error) {
	key := NodeStatusKey(prefix)
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	out := make([]console.ConsumerStatus, 0, len(h))
	var gone []string
	for field, v := range h {
		var st console.ConsumerStatus
		if json.Unmarshal([]byte(v), &st) != nil {
			continue
		}
		switch fleet.Judge(st.Reported, now) {
		case fleet.Gone:
			gone = append(gone, field)
			continue
		case fleet.Stale:
			st.Stale = true
		}
		out = append(out, st)
	}
	if len(gone) > 0 {
		_ = rdb.HDel(ctx, key, gone...).Err()
	}
	return out, nil
}

// StatsKey is the hash of every account's days (one key: one slot in
// Redis Cluster); kf-producer writes it (internal/service).
func StatsKey(prefix string) string { return prefix + "{kfstats}:corp" }

// readStats returns the days kf-producer wrote, per open_kfid.
func readStats(ctx context.Context, rdb redis.UniversalClient, prefix string) (map[string][]console.AccountDay, error) {
	all, err := rdb.HGetAll(ctx, StatsKey(prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("read statistics: %w", err)
	}
	out := make(map[string][]console.AccountDay, len(all))
	for id, v := range all {
		var days []console.AccountDay
		if err := json.Unmarshal([]byte(v), &days); err != nil {
			return nil, fmt.Errorf("statistics of %s: %w", id, err)
		}
		out[id] = days
	}
	return out, nil
}
