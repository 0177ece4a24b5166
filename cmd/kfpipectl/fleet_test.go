package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestFleetViewsAgree: `kfpipectl fleet` (the etcd registry) and `kfpipectl
// health` (the consumers' status reports in Redis, the console's consumers
// table) judge a silent consumer by one rule (fleet.Judge). A consumer
// killed a minute ago is stale in both and its actors are not counted; one
// killed 10 minutes ago is in neither; one stopped cleanly leaves at once;
// a live one is live in both.
func TestFleetViewsAgree(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	rdb, _ := testenv.Redis(t)
	const keepAlive = 2 * time.Second
	d, cfg, _ := startDLQConsumer(t, func(c *config.DLQConsumer) {
		c.Coord.Enabled, c.Coord.Endpoints, c.Coord.Namespace = true, testenv.EtcdEndpoints(t), ns
		c.Coord.KeepAlive = keepAlive
	})
	ctx := t.Context()
	viewer := ctl{t: t, env: map[string]string{"KFPIPE_ADMIN_URL": d.AdminURL, "KFPIPE_TOKEN": cfg.Admin.Tokens[1].Token}}

	join := func(id string) *fleet.Self {
		p := coordtest.Provider(t, ns, func(c *coord.Config) { c.KeepAlive = keepAlive })
		m := fleet.NewMember("schedule-consumer", "v1", "127.0.0.1:1")
		m.ID, m.Actors = id, 5
		s, err := fleet.Join(ctx, p, m, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	join("sc-live")
	join("sc-killed")
	stopped := join("sc-stopped")
	if err := stopped.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	// The kill: the registration's lease ends without a Leave.
	resp, err := raw.Get(ctx, ns+"services/"+fleet.Service+"/sc-killed")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("registration of sc-killed: %v %v", resp, err)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	// Their status reports: sc-killed's last a minute ago, sc-gone's ten.
	now := time.Now().UTC()
	for node, at := range map[string]time.Time{"sc-live": now, "sc-killed": now.Add(-time.Minute),
		"sc-gone": now.Add(-10 * time.Minute)} {
		b, _ := json.Marshal(console.ConsumerStatus{Node: node, Reported: at, Actors: 5, Partitions: 1})
		if err := rdb.HSet(ctx, cfg.Redis.KeyPrefix+"consumer:status", node, b).Err(); err != nil {
			t.Fatal(err)
		}
	}

	var f console.FleetList
	deadline := time.Now().Add(20 * time.Second)
	for {
		jsonOf(t, viewer.must(0, "fleet", "-o", "json"), &f)
		state := map[string]bool{} // ID: stale
		for _, m := range f.Members {
			state[m.ID] = m.Stale
		}
		stale, seen := state["sc-killed"]
		_, stoppedSeen := state["sc-stopped"]
		if live, ok := state["sc-live"]; ok && !live && seen && stale && !stoppedSeen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet %+v: want sc-live live, sc-killed stale, sc-stopped gone", f.Members)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := viewer.must(0, "fleet").out
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "sc-killed") && !strings.Contains(line, "(stale)") {
			t.Errorf("fleet table: sc-killed not marked stale: %q", line)
		}
		if strings.Contains(line, "sc-live") && strings.Contains(line, "stale") {
			t.Errorf("fleet table: sc-live marked stale: %q", line)
		}
	}

	// accounts lists the accounts kf-producer reported, with their state.
	st, _ := json.Marshal(map[string]any{"open_kfid": "wk-ctl-acct", "last_success": now, "reported": now})
	if err := rdb.HSet(ctx, cfg.Redis.KeyPrefix+"sync:status", "wk-ctl-acct", st).Err(); err != nil {
		t.Fatal(err)
	}
	if out := viewer.must(0, "accounts").out; !strings.Contains(out, "ACCOUNT") ||
		!regexp.MustCompile(`(?m)^wk-ctl-acct\s+ok\s`).MatchString(out) {
		t.Fatalf("accounts:\n%s", out)
	}

	// health prints the overview's consumers table and actor total.
	data := viewer.must(0, "health").out
	rows := map[string]string{}
	actors := ""
	for _, line := range strings.Split(data, "\n") {
		fs := strings.Fields(line)
		switch {
		case len(fs) > 0 && strings.HasPrefix(fs[0], "sc-"):
			rows[fs[0]] = line
		case strings.HasPrefix(line, "active actors"):
			actors = strings.Join(fs[2:], " ")
		}
	}
	if len(rows) != 2 || rows["sc-live"] == "" || strings.Contains(rows["sc-live"], "stale") ||
		!strings.Contains(rows["sc-killed"], "(stale)") || actors != "5" {
		t.Fatalf("health: consumers %q, active actors %q: want sc-live live, sc-killed stale, sc-gone absent, 5 actors\n%s",
			rows, actors, data)
	}
}
