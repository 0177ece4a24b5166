package chaos

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// chaosClusterPort is the first port of the scenarios' own Redis Cluster
// (3 masters, 3 replicas on chaosClusterPort..+5, bus ports +10000): its
// nodes are killed and its slots moved, so it is not the shared test
// cluster other tests use.
const chaosClusterPort = 17100

// redisCluster is a Redis Cluster of a scenario's own, started with
// scripts/redis.sh cluster-start on its own ports and run directory.
type redisCluster struct {
	t      *testing.T
	base   int
	runDir string
	Seeds  []string
}

// startRedisCluster starts a 3-master, 3-replica cluster on base..base+5
// and stops it at cleanup.
func startRedisCluster(t *testing.T, base int) *redisCluster {
	t.Helper()
	testenv.Tool(t, "redis-server")
	testenv.Tool(t, "redis-cli")
	c := &redisCluster{t: t, base: base, runDir: t.TempDir()}
	for i := range 6 {
		for _, port := range []int{base + i, base + i + 10000} {
			a := "127.0.0.1:" + strconv.Itoa(port)
			if conn, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
				_ = conn.Close()
				t.Fatalf("%s is in use: the scenario's Redis Cluster needs ports %d-%d and their bus ports", a, base, base+5)
			}
		}
		c.Seeds = append(c.Seeds, "127.0.0.1:"+strconv.Itoa(base+i))
	}
	t.Cleanup(func() {
		if err := c.node("").run("cluster-stop"); err != nil {
			t.Logf("cluster-stop: %v", err)
		}
	})
	if err := c.node("").run("cluster-start"); err != nil {
		t.Fatal(err)
	}
	return c
}

// node is the cluster node named name (cluster-0..cluster-5) for
// redis.sh's kill9 and resume.
func (c *redisCluster) node(name string) *Node {
	n := &Node{t: c.t, script: "redis.sh", name: name, runDir: c.runDir}
	n.env = []string{"KFPIPE_RUN_DIR=" + c.runDir, "KFPIPE_REDIS_CLUSTER_PORT=" + strconv.Itoa(c.base)}
	if name == "" {
		n.name = "cluster-0" // ignored by cluster-start/stop
	}
	return n
}

// nameOf is the node name of addr (127.0.0.1:base+i is cluster-i).
func (c *redisCluster) nameOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	return fmt.Sprintf("cluster-%d", p-c.base)
}

// masterOf returns the address of the master serving slot, as a node that
// is not skip sees it ("" when none does).
func masterOf(ctx context.Context, seeds []string, skip string, slot int) string {
	for _, a := range seeds {
		if a == skip {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: 300 * time.Millisecond,
			ReadTimeout: time.Second})
		//lint:ignore SA1019 CLUSTER SLOTS lists each range's master first, which is all this needs; Redis 7.0 serves it
		slots, err := c.ClusterSlots(ctx).Result()
		_ = c.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr
			}
		}
		return ""
	}
	return ""
}

// partitionSlots are the hash slots of the consumer state store's
// partitions of p's main topic ("{topic:partition}").
func partitionSlots(p *Pipeline) []int {
	var out []int
	for i := range p.Opts.Partitions {
		out = append(out, redisconn.Slot("{"+p.MainTopic+":"+strconv.Itoa(i)+"}"))
	}
	return out
}

// clusterScenario starts the cluster scenarios' pipeline: two consumers,
// six partitions, every daemon on a Redis Cluster of the scenario's own,
// the Sink fencing (it keeps the newest lease token per user and refuses
// older ones, counted as fenced_refused), and the stall bound around *at,
// the fault's time, which the fault sets: every message sent from 5 s
// before it to 30 s after takes effect within 30 s. The load is 10,000
// messages of 500 users at 200/s.
func clusterScenario(t *testing.T, at *time.Time) (*redisCluster, *Pipeline, Load) {
	t.Helper()
	svc := NeedServices(t)
	rc := startRedisCluster(t, chaosClusterPort)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: rc.Seeds[0], Kcat: svc.Kcat, Consumers: 2,
		Partitions: 6, SinkSleep: time.Millisecond, ClusterAddrs: rc.Seeds})
	p.Sink.Fence(true)
	stall := stallJudge(at, 30*time.Second, 30*time.Second)
	p.Opts.Judge = func(ev *Evidence, rep *Report) {
		rep.Extra("fenced_refused", p.Sink.Fenced())
		stall(ev, rep)
	}
	return rc, p, Load{Total: 10000, Users: 500, Rate: 200}
}

// stallJudge adds the stall bound of a fault at *at: the longest a message
// sent within [at-5s, at+window] waited for its effect (max_effect_wait),
// a problem past limit.
func stallJudge(at *time.Time, window, limit time.Duration) func(ev *Evidence, rep *Report) {
	return func(ev *Evidence, rep *Report) {
		if at.IsZero() {
			rep.Problem("the fault never happened: no stall measured")
			return
		}
		first := map[string]time.Time{}
		for _, d := range ev.Deliveries {
			if f, ok := first[d.MsgID]; !ok || d.At.Before(f) {
				first[d.MsgID] = d.At
			}
		}
		var worst time.Duration
		n := 0
		for _, s := range ev.Sent {
			if s.At.Before(at.Add(-5*time.Second)) || s.At.After(at.Add(window)) {
				continue
			}
			f, ok := first[s.MsgID]
			if !ok {
				continue // a loss, reported as such
			}
			n++
			if w := f.Sub(s.At); w > worst {
				worst = w
			}
		}
		rep.Extra("max_effect_wait", worst.Round(100*time.Millisecond))
		rep.Extra("messages_around_fault", n)
		if n == 0 {
			rep.Problem("no message was sent around the fault: no stall measured")
		}
		if worst > limit {
			rep.Problem("max_effect_wait %s around the fault exceeds %s", worst.Round(100*time.Millisecond), limit)
		}
	}
}

// TestChaosClusterFailover (full suite only): every daemon runs on a Redis
// Cluster of the scenario's own (3 masters, 3 replicas). Under load the
// master serving the most of the consumer state store's partitions is
// killed with SIGKILL; its replica is promoted (cluster-node-timeout 2 s)
// and the daemons follow the new slot map. lost=0 dup=0 reordered=0; the
// Sink keeps the newest fencing token per user and refuses older ones, so
// a lease token that went backwards across the failover would refuse that
// partition's effects (fenced_refused, and their messages lost). The stall
// bound: every message sent from 5 s before the kill to 30 s after it
// takes effect within 30 s (max_effect_wait).
//
// Replication is asynchronous, as with Sentinel: a done mark the dying
// master acknowledged but had not passed on is gone, and its message can
// take effect again: such repeats are counted as dup_after_failover when
// the first effect lay within Options.FailoverWindow before the kill.
func TestChaosClusterFailover(t *testing.T) {
	SkipUnlessFull(t)
	var down time.Time
	rc, p, load := clusterScenario(t, &down)
	Run(t, "cluster-failover", p, load, 4*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 15*time.Second, 18*time.Second) {
			return ctx.Err()
		}
		// The victim: the master with most of the state's partitions.
		count := map[string]int{}
		for _, s := range partitionSlots(p) {
			count[masterOf(ctx, rc.Seeds, "", s)]++
		}
		victim, most := "", 0
		for a, n := range count {
			if a != "" && (n > most || n == most && a < victim) {
				victim, most = a, n
			}
		}
		if victim == "" {
			return fmt.Errorf("no master found for the state partitions' slots")
		}
		slot := 0
		for _, s := range partitionSlots(p) {
			if masterOf(ctx, rc.Seeds, "", s) == victim {
				slot = s
				break
			}
		}
		rec.Extra("victim", fmt.Sprintf("%s(%d/%d partitions)", rc.nameOf(victim), most, p.Opts.Partitions))
		down = time.Now()
		if err := rc.node(rc.nameOf(victim)).Kill9(); err != nil {
			return err
		}
		p.RecordFailover(down, time.Now())
		promoted := false
		for time.Since(down) < 30*time.Second {
			if m := masterOf(ctx, rc.Seeds, victim, slot); m != "" && m != victim {
				promoted = true
				rec.Extra("replica_promoted_after", time.Since(down).Round(100*time.Millisecond))
				break
			}
			if !Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
				return ctx.Err()
			}
		}
		if !promoted {
			rec.Problem("no replica of %s promoted within 30s", victim)
		}
		for _, d := range p.Daemons() {
			if body, ok := waitReadyz(ctx, d, 200, 30*time.Second); !ok {
				rec.Problem("%s not ready 30s after the failover: %s", d.Tag(), body)
			}
		}
		rec.Extra("all_ready_after", time.Since(down).Round(100*time.Millisecond))
		// The old master comes back as a replica of the promoted one.
		return rc.node(rc.nameOf(victim)).Resume()
	})
}

// TestChaosClusterReshard (full suite only): every daemon runs on a Redis
// Cluster of the scenario's own. Under load the slots of the consumer
// state store's partitions (the live users' leases, marks and queues) are
// moved to another master as redis-cli --cluster reshard moves a slot
// (MIGRATE of its keys, one at a time with 400 ms between, so the clients
// work against half-moved slots for seconds; the redirections the nodes
// answered are reported: asked, moved, tryagain); the clients follow MOVED and
// ASK and retry TRYAGAIN. lost=0 dup=0 reordered=0,
// and every message sent from 5 s before the move to 30 s after it takes
// effect within 30 s (max_effect_wait).
func TestChaosClusterReshard(t *testing.T) {
	SkipUnlessFull(t)
	var moved time.Time
	rc, p, load := clusterScenario(t, &moved)
	Run(t, "cluster-reshard", p, load, 4*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 15*time.Second, 18*time.Second) {
			return ctx.Err()
		}
		ids, err := nodeIDs(ctx, rc.Seeds[0])
		if err != nil {
			return err
		}
		before := redirections(ctx, rc.Seeds)
		defer func() {
			after := redirections(ctx, rc.Seeds)
			for _, k := range []string{"ASK", "MOVED", "TRYAGAIN"} {
				rec.Extra(strings.ToLower(k), after[k]-before[k])
			}
		}()
		moved = time.Now()
		n, keys := 0, 0
		for _, s := range partitionSlots(p) {
			from := masterOf(ctx, rc.Seeds, "", s)
			to := ""
			masters := make([]string, 0, len(ids))
			for a := range ids {
				masters = append(masters, a)
			}
			sort.Strings(masters)
			for _, a := range masters {
				if a != from {
					to = a
					break
				}
			}
			if from == "" || to == "" {
				return fmt.Errorf("slot %d: no master to move it from (%q) or to", s, from)
			}
			k, err := moveSlot(ctx, ids, s, from, to, 1, 400*time.Millisecond)
			keys += k
			if err != nil {
				return fmt.Errorf("move slot %d %s -> %s: %w", s, from, to, err)
			}
			if got := masterOf(ctx, rc.Seeds, "", s); got != to {
				rec.Problem("slot %d served by %s after the move, want %s", s, got, to)
			}
			n++
		}
		rec.Extra("slots_moved", n)
		rec.Extra("keys_moved", keys)
		if keys == 0 {
			rec.Problem("the partitions' slots held no keys: nothing was moved under load")
		}
		rec.Extra("move_took", time.Since(moved).Round(100*time.Millisecond))
		return nil
	})
}

// redirections sums the redirections and retries the nodes answered
// (INFO errorstats: ASK, MOVED, TRYAGAIN) over every node.
func redirections(ctx context.Context, nodes []string) map[string]int {
	out := map[string]int{}
	for _, a := range nodes {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.Info(ctx, "errorstats").Result()
		_ = c.Close()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(l, "errorstat_")), ":count=")
			if !ok {
				continue
			}
			n, _ := strconv.Atoi(rest)
			out[name] += n
		}
	}
	return out
}

// nodeIDs maps the address of every master of the cluster to its node ID.
func nodeIDs(ctx context.Context, seed string) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: seed})
	defer c.Close()
	out, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		addr := f[1]
		if i := strings.IndexByte(addr, '@'); i >= 0 {
			addr = addr[:i]
		}
		ids[addr] = f[0]
	}
	if len(ids) < 2 {
		return nil, fmt.Errorf("cluster nodes: %d masters, want at least 2:\n%s", len(ids), out)
	}
	return ids, nil
}

// moveSlot moves slot, keys included, from the master at from to the one
// at to, as redis-cli --cluster reshard does for each slot it moves
// (reshard picks the slots itself; this scenario moves given ones):
// SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE of the
// slot's keys in batches (meanwhile the source answers ASK for a key it no
// longer has), then SETSLOT NODE on the target, the source and the other
// masters (then every node answers MOVED).
//
// The keys go batch at a time with pause between batches, so that the
// clients work against a half-moved slot for a while: ASK for the keys
// already moved, TRYAGAIN for a script whose keys are on both sides. It
// returns the number of keys moved.
func moveSlot(ctx context.Context, ids map[string]string, slot int, from, to string, batch int, pause time.Duration) (int, error) {
	client := func(a string) *redis.Client { return redis.NewClient(&redis.Options{Addr: a}) }
	src, dst := client(from), client(to)
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return 0, fmt.Errorf("importing: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return 0, fmt.Errorf("migrating: %w", err)
	}
	host, port, _ := net.SplitHostPort(to)
	moved := 0
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return moved, fmt.Errorf("getkeysinslot: %w", err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return moved, fmt.Errorf("migrate %d keys: %w", len(keys), err)
		}
		moved += len(keys)
		if !Pause(ctx, pause, pause) {
			return moved, ctx.Err()
		}
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
		return moved, fmt.Errorf("node on target: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
		return moved, fmt.Errorf("node on source: %w", err)
	}
	for a := range ids {
		if a == from || a == to {
			continue
		}
		c := client(a)
		err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err()
		_ = c.Close()
		if err != nil {
			return moved, fmt.Errorf("node on %s: %w", a, err)
		}
	}
	return moved, nil
}
