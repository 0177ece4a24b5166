package service

import (
	"context"
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/dlq/admin"
)

// A schedule-consumer's actors and breakers live in its memory; the
// console's overview (on the dlq-consumer) shows them because every
// schedule-consumer publishes a small status to the Redis hash
// <prefix>consumer:status every nodeStatusInterval, one field per process,
// read from the process's own metrics. A field older than three intervals
// is a process that stopped or lost Redis; the hash expires an hour after
// its last write.
const (
	nodeStatusInterval = 10 * time.Second
	nodeStatusKeep     = time.Hour
)

func nodeStatusKey(prefix string) string { return prefix + "consumer:status" }

// publishNodeStatus writes this process's status every interval until ctx
// ends, then removes it (a clean stop is not a stale status).
func publishNodeStatus(ctx context.Context, rdb redis.UniversalClient, prefix string, g prometheus.Gatherer, log *zap.Logger) {
	node, key := nodeName(), nodeStatusKey(prefix)
	write := func() {
		st := admin.ConsumerStatus{Node: node, Reported: time.Now().UTC(),
			Actors:       int(gaugeSum(g, "kfpipe_active_processors")),
			OpenBreakers: int(gaugeSum(g, "kfpipe_circuit_breakers_open")),
			Partitions:   int(gaugeSum(g, "kfpipe_consumer_partitions_assigned"))}
		b, _ := json.Marshal(st)
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		pipe := rdb.TxPipeline()
		pipe.HSet(wctx, key, node, b)
		pipe.Expire(wctx, key, nodeStatusKeep)
		if _, err := pipe.Exec(wctx); err != nil && ctx.Err() == nil {
			log.Debug("consumer status not published", zap.Error(err))
		}
	}
	tick := time.NewTicker(nodeStatusInterval)
	defer tick.Stop()
	for {
		write()
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = rdb.HDel(dctx, key, node).Err()
			cancel()
			return
		case <-tick.C:
		}
	}
}

// gaugeSum is the sum of a gauge family's series in g (0 when absent).
func gaugeSum(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// consumerStatuses reads the status hash.
func consumerStatuses(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]admin.ConsumerStatus, error) {
	h, err := rdb.HGetAll(ctx, nodeStatusKey(prefix)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]admin.ConsumerStatus, 0, len(h))
	for _, v := range h {
		var st admin.ConsumerStatus
		if json.Unmarshal([]byte(v), &st) == nil {
			out = append(out, st)
		}
	}
	return out, nil
}
