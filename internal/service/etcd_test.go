package service

import (
	"context"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestEtcdOutageDegradesButKeepsTheDaemonReady: a daemon whose etcd link
// is cut (a real proxy between them) stays ready — nothing it does needs
// etcd from moment to moment — while /readyz names etcd as degraded and
// kfpipe_coord_reachable is 0; both clear when the link is back, and its
// fleet entry is still there.
func TestEtcdOutageDegradesButKeepsTheDaemonReady(t *testing.T) {
	testenv.KafkaBrokers(t)
	_, prefix := testenv.Redis(t)
	raw, ns := testenv.Etcd(t)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(srv, "etcd", "127.0.0.1:0", strings.TrimPrefix(testenv.EtcdEndpoints(t)[0], "http://"))
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := config.LoadConsumer("../../config/test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	common(t, &cfg.Common, testenv.Name(t, "main"), testenv.Name(t, "dlq"), prefix, testenv.Name(t, "group"))
	t.Cleanup(func() {
		_, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{cfg.Kafka.Topics.Main.Name, cfg.Kafka.Topics.DLQ.Name})
	})
	cfg.Coord.Enabled, cfg.Coord.Endpoints, cfg.Coord.Namespace = true, []string{px.Listen}, ns
	cfg.Coord.DialTimeout, cfg.Coord.KeepAlive = time.Second, 30*time.Second
	base, err := daemon.Start(ctx, "schedule-consumer", cfg.Common)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close(context.Background())

	etcdDetail := func() string { return base.Ops.Details()["etcd"] }
	reachable := func() float64 {
		mfs, _ := base.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "kfpipe_coord_reachable" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	if d := etcdDetail(); d != "" || reachable() != 1 {
		t.Fatalf("before the cut: detail %q, reachable %v", d, reachable())
	}
	px.Stop()
	testenv.Eventually(t, 20*time.Second, func() error {
		return testenv.Check(strings.Contains(etcdDetail(), "degraded"), "etcd reported degraded")
	})
	if fails := base.Ops.Ready(ctx); len(fails) != 0 {
		t.Fatalf("not ready during the etcd outage: %v", fails)
	}
	if r := reachable(); r != 0 {
		t.Fatalf("kfpipe_coord_reachable = %v during the outage, want 0", r)
	}
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error { return testenv.Check(etcdDetail() == "" && reachable() == 1, "etcd detail cleared") })
	resp, err := raw.Get(ctx, ns+"services/kfpipe/"+base.Fleet.Member().ID)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("fleet entry after the outage: %v %v", resp, err)
	}
}
