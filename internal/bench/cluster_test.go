package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func stats(master bool, cpu time.Duration, mem int64, calls map[string]int64) nodeStats {
	s := redisStats{usedMemory: mem, cpu: cpu, calls: map[string]int64{}, cmds: map[string]cmdStats{}}
	for k, v := range calls {
		s.calls[k], s.cmds[k] = v, cmdStats{calls: v, usec: 2 * v}
	}
	return nodeStats{master: master, redisStats: s}
}

// The masters' sum leaves the replicas out, each node's delta is its own,
// and a node that appeared or changed role during the phase is an error
// (the sum would not cover the phase).
func TestNodeCostsSumsMasters(t *testing.T) {
	before := map[string]nodeStats{
		"m1": stats(true, time.Second, 1000, map[string]int64{"sadd": 10}),
		"m2": stats(true, time.Second, 1000, map[string]int64{"sadd": 10}),
		"r1": stats(false, time.Second, 1000, nil),
	}
	after := map[string]nodeStats{
		"m1": stats(true, time.Second+300*time.Microsecond, 1100, map[string]int64{"sadd": 40}),
		"m2": stats(true, time.Second+100*time.Microsecond, 1300, map[string]int64{"sadd": 20, "info": 5}),
		"r1": stats(false, time.Second+50*time.Microsecond, 1000, nil),
	}
	b := serverStats{all: sumStats(before, true), replicas: sumStats(before, false), nodes: before}
	a := serverStats{all: sumStats(after, true), replicas: sumStats(after, false), nodes: after}
	d := delta(b.all, a.all, 10)
	if d.cpu != 40 || d.calls != 4 || d.bytes != 40 {
		t.Fatalf("masters' sum: cpu %v µs, calls %v, bytes %v a message; want 40, 4 (info left out), 40", d.cpu, d.calls, d.bytes)
	}
	if r := delta(b.replicas, a.replicas, 10); r.cpu != 5 {
		t.Fatalf("replicas' cpu %v µs a message, want 5", r.cpu)
	}
	nodes, err := nodeCosts(b, a, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeCost{{Addr: "m1", Role: "master", CPUus: 30, Calls: 3, Bytes: 10, Partitions: -1},
		{Addr: "m2", Role: "master", CPUus: 10, Calls: 1, Bytes: 30, Partitions: -1},
		{Addr: "r1", Role: "replica", CPUus: 5, Partitions: -1}}
	if fmt.Sprint(nodes) != fmt.Sprint(want) {
		t.Fatalf("nodes %+v, want %+v", nodes, want)
	}
	promoted := map[string]nodeStats{"m1": after["m1"], "m2": after["m2"], "r1": stats(true, 2*time.Second, 0, nil)}
	if _, err := nodeCosts(b, serverStats{nodes: promoted}, 10); err == nil || !strings.Contains(err.Error(), "r1") {
		t.Fatalf("a replica promoted during the phase: %v, want an error naming it", err)
	}
	delete(promoted, "r1")
	if _, err := nodeCosts(b, serverStats{nodes: promoted}, 10); err == nil {
		t.Fatal("a node gone during the phase: no error")
	}

	r := Result{Scenario: "x_cluster", MsgsPerSec: 500, Extra: map[string]any{"redis_cpu_us_per_msg": 6.0}}
	pairWith(&r, Result{Scenario: "x", MsgsPerSec: 1000, Extra: map[string]any{"redis_cpu_us_per_msg": 3.0}})
	if r.Baseline != "x" || r.Ratio != 0.5 || r.Extra["redis_cpu_ratio_vs_single"] != 2.0 || r.Extra["single_redis_cpu_us_per_msg"] != 3.0 {
		t.Fatalf("paired row: %+v", r)
	}
}

// clusterEnv is an Env on the test Redis Cluster alone (no broker, no
// single Redis): enough for the store-level phase and the INFO readings.
func clusterEnv(t *testing.T) *Env {
	t.Helper()
	addrs := testenv.RedisClusterAddrs(t)
	e := &Env{Prefix: testenv.Name(t, "bench")}
	if err := e.ConnectCluster(addrs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			unlinkPrefix(ctx, m, e.Prefix+":*")
			return nil
		})
		_ = e.Cluster.Close()
	})
	return e
}

// The Cluster reading covers every master: after writes to each master's
// slot range, each master's delta shows them (calls and CPU), and the
// masters' sum is the sum of the nodes'. A master left out, or a delta of
// 0, would be a broken measurement.
func TestClusterStatsCoverEveryMaster(t *testing.T) {
	e := clusterEnv(t)
	master, masters, err := e.masterOfSlot()
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("the test cluster has %d masters (%v), want 3 (scripts/services.sh)", len(masters), masters)
	}
	ctx := context.Background()
	before, err := e.statsOn(true)
	if err != nil {
		t.Fatal(err)
	}
	// 200 writes a master: keys picked by their slot.
	per := map[string]int{}
	pipe := e.Cluster.Pipeline()
	for i := 0; len(per) < len(masters) || minCount(per) < 200; i++ {
		k := fmt.Sprintf("%s:w:%d", e.Prefix, i)
		m := master(redisconn.Slot(k))
		if per[m] >= 200 {
			continue
		}
		per[m]++
		pipe.Set(ctx, k, strings.Repeat("v", 100), time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := e.statsOn(true)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := nodeCosts(before, after, 600)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var sumCalls, sumCPU float64
	for _, n := range nodes {
		if n.Role != "master" {
			continue
		}
		got = append(got, n.Addr)
		sumCalls += n.Calls
		sumCPU += n.CPUus
		// 200 SETs of 600 messages: a third of a call each, plus the
		// cluster's own traffic (PING, CLUSTER commands).
		if n.Calls < 0.33 || n.CPUus <= 0 {
			t.Errorf("master %s: %.3f calls, %.3f µs CPU a message after 200 writes to it; want ≥ 0.33 and > 0", n.Addr, n.Calls, n.CPUus)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(masters) {
		t.Fatalf("per-master deltas for %v, the cluster's masters are %v", got, masters)
	}
	all := delta(before.all, after.all, 600)
	if all.calls < 1 || all.calls-sumCalls > 0.01 || sumCalls-all.calls > 0.01 || all.cpu <= 0 {
		t.Fatalf("masters' sum: %.3f calls (nodes' sum %.3f), %.3f µs; want ≥ 1, equal, > 0", all.calls, sumCalls, all.cpu)
	}
	if d := all.cpu - sumCPU; d > 0.01 || d < -0.01 {
		t.Fatalf("masters' CPU sum %.3f µs, nodes' %.3f", all.cpu, sumCPU)
	}
}

func minCount(m map[string]int) int {
	lo := -1
	for _, v := range m {
		if lo < 0 || v < lo {
			lo = v
		}
	}
	return lo
}

// The state scenario's store-level phase on the Cluster (a small dense
// workload): its partitions' state is spread over every master, each
// master's figures are its own and not 0, and the row's Redis CPU per
// message (summed over the masters) is not 0.
func TestStatePartitionedOnCluster(t *testing.T) {
	e := clusterEnv(t)
	msgs, users, err := WorkloadMessages(e.Prefix+"-dense", WorkloadDense, 20000, 400, 30)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.statePartitioned(WorkloadDense, msgs, users, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Scenario != "state_dense_partition_cluster" || r.Extra["redis"] != "cluster" {
		t.Fatalf("row %s, redis %v", r.Scenario, r.Extra["redis"])
	}
	nodes, _ := r.Extra["nodes"].([]NodeCost)
	var masters, parts int
	for _, n := range nodes {
		if n.Role != "master" {
			continue
		}
		masters++
		parts += n.Partitions
		if n.Partitions < 1 || n.Calls <= 0 || n.CPUus <= 0 {
			t.Errorf("master %s: %d partitions, %.3f calls, %.3f µs a message; want each > 0", n.Addr, n.Partitions, n.Calls, n.CPUus)
		}
	}
	if masters != 3 || parts != 4 {
		t.Fatalf("%d masters holding %d partitions, want 3 holding 4: %+v", masters, parts, nodes)
	}
	if cpu, _ := r.Extra["redis_cpu_us_per_msg"].(float64); cpu <= 0 {
		t.Fatalf("redis_cpu_us_per_msg %v on the cluster: a broken measurement", r.Extra["redis_cpu_us_per_msg"])
	}
	if kb, _ := r.Extra["redis_key_bytes_per_msg"].(float64); kb <= 0 {
		t.Fatalf("redis_key_bytes_per_msg %v: the state's keys were not found on the masters", r.Extra["redis_key_bytes_per_msg"])
	}
	if rc, _ := r.Extra["replica_cpu_us_per_msg"].(float64); rc <= 0 {
		t.Fatalf("replica_cpu_us_per_msg %v: the replicas' readings are missing", r.Extra["replica_cpu_us_per_msg"])
	}
}
