package service

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsumerStatusPublished: a schedule-consumer's status (actors, open
// breakers, partitions, from its own gauges) reaches the Redis hash the
// overview reads, and is removed when the consumer stops.
func TestConsumerStatusPublished(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	for name, v := range map[string]float64{"kfpipe_active_processors": 17, "kfpipe_circuit_breakers_open": 2, "kfpipe_consumer_partitions_assigned": 6,
		"kfpipe_outage_gate_open": 1} {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: name})
		g.Set(v)
		reg.MustRegister(g)
	}
	cfg := &config.DLQConsumer{}
	cfg.Redis.KeyPrefix = prefix
	view := sources.NewPipeline(cfg, sources.Deps{Redis: rdb})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		publishNodeStatus(ctx, rdb, prefix, reg, zaptest.NewLogger(t))
	}()
	testenv.Eventually(t, 5*time.Second, func() error {
		st, err := view.Consumers(context.Background())
		return testenv.Check(err == nil && len(st) == 1 && st[0].Actors == 17 && st[0].OpenBreakers == 2 && st[0].Partitions == 6 &&
			st[0].OutageGateOpen && st[0].Node == nodeName() && time.Since(st[0].Reported) < 5*time.Second, "the status published")
	})
	cancel()
	<-done
	if st, err := view.Consumers(context.Background()); err != nil || len(st) != 0 {
		t.Fatalf("after the stop: %+v %v, want none", st, err)
	}
}
