package service

import (
	"context"
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/console/sources"
)

// A schedule-consumer's actors and breakers live in its memory; the
// console's overview (on the dlq-consumer) shows them because every
// schedule-consumer publishes a small status to the Redis hash
// <prefix>consumer:status every nodeStatusInterval, one field per process,
// read from the process's own metrics. A field is judged by fleet.Judge,
// the rule of every fleet view: not written for three intervals it is a
// process that stopped or lost Redis (stale), and after fleet.GoneAfter it
// is left out and deleted. The hash expires an hour after its last write.
const (
	nodeStatusInterval = 10 * time.Second
	nodeStatusKeep     = time.Hour
)

// publishNodeStatus writes this process's status every interval until ctx
// ends, then removes it (a clean stop is not a stale status).
func publishNodeStatus(ctx context.Context, rdb redis.UniversalClient, prefix string, g prometheus.Gatherer, log *zap.Logger) {
	node, key := nodeName(), sources.NodeStatusKey(prefix)
	write := func() {
		sums := gaugeSums(g)
		st := console.ConsumerStatus{Node: node, Reported: time.Now().UTC(),
			Actors:         int(sums["kfpipe_active_processors"]),
			OpenBreakers:   int(sums["kfpipe_circuit_breakers_open"]),
			Partitions:     int(sums["kfpipe_consumer_partitions_assigned"]),
			OutageGateOpen: sums["kfpipe_outage_gate_open"] > 0,
			HandlerLimit:   int(sums["kfpipe_handler_limit"]), HandlerInFlight: int(sums["kfpipe_handler_in_flight"]),
			HandlerWaiting: int(sums["kfpipe_handler_waiting"]), HandlerLatency: sums["kfpipe_handler_latency_seconds"]}
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

// gaugeSums gathers g once and sums each gauge family's series by name.
func gaugeSums(g prometheus.Gatherer) map[string]float64 {
	out := map[string]float64{}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.Gauge != nil {
				out[mf.GetName()] += m.GetGauge().GetValue()
			}
		}
	}
	return out
}
