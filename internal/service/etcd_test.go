package service

import (
	"context"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestEtcdOutageDegradesButKeepsTheDaemonReady: a daemon whose etcd link
// is cut (a real proxy between them) stays ready — nothing it does needs
// etcd from moment to moment — while /readyz names etcd as degraded and
// kfpipe_coord_reachable is 0; both clear when the link is back, and its
// fleet entry is still there.
func TestEtcdOutageDegradesButKeepsTheDaemonReady(t *testing.T) {
	pc := newPlace(t)
	raw, ns := testenv.Etcd(t)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(srv, "etcd", "127.0.0.1:0", strings.TrimPrefix(testenv.EtcdEndpoints(t)[0], "http://"))
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := pc.consumerConfig(t)
	cfg.Coord.Enabled, cfg.Coord.Endpoints, cfg.Coord.Namespace = true, []string{px.Listen}, ns
	cfg.Coord.DialTimeout, cfg.Coord.KeepAlive = time.Second, 30*time.Second
	base := startBase(t, ctx, "schedule-consumer", cfg.Common)

	etcdDetail := func() string { return base.Ops.Details()["etcd"] }
	reachable := func() float64 { // -1 when not registered
		if v, ok := testenv.Gathered(t, base.Registry, "kfpipe_coord_reachable"); ok {
			return v
		}
		return -1
	}
	if d := etcdDetail(); d != "" || reachable() != 1 {
		t.Fatalf("before the cut: detail %q, reachable %v", d, reachable())
	}
	px.Stop()
	testenv.Eventually(t, 20*time.Second, func() error {
		d := etcdDetail()
		return testenv.Check(strings.Contains(d, "degraded"), "etcd detail %q, want it degraded", d)
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
	testenv.Eventually(t, 20*time.Second, func() error {
		d, r := etcdDetail(), reachable()
		return testenv.Check(d == "" && r == 1, "etcd detail %q and kfpipe_coord_reachable %v, want none and 1", d, r)
	})
	resp, err := raw.Get(ctx, ns+"services/kfpipe/"+base.Fleet.Member().ID)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("fleet entry after the outage: %v %v", resp, err)
	}
}
