package bench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// The state scenario's Cluster rows: the same workload as the single-Redis
// rows, on a Redis Cluster (redis.mode: cluster), with Redis's figures
// read from every node (INFO per node) and summed over the masters; the
// replicas' are reported apart (replication costs them CPU too).

// ConnectCluster connects the run to a Redis Cluster by its seed addresses
// (redis.mode: cluster); the state scenario then adds its Cluster rows.
// The cluster must say cluster_state:ok.
func (e *Env) ConnectCluster(addrs []string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("redis cluster: no seed address")
	}
	for i, a := range addrs {
		if a = strings.TrimSpace(a); a == "" {
			return fmt.Errorf("redis cluster: seed address %d is empty", i)
		}
		addrs[i] = a
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = fmt.Errorf("cluster_state is not ok")
	}
	if err != nil {
		_ = c.Close()
		return fmt.Errorf("redis cluster %s: %w", strings.Join(addrs, ","), err)
	}
	e.Cluster, e.ClusterAddrs = c, addrs
	return nil
}

// client is the Redis a phase runs on.
func (e *Env) client(onCluster bool) redis.UniversalClient {
	if onCluster {
		return e.Cluster
	}
	return e.Redis
}

// nodeStats is one Cluster node's INFO reading.
type nodeStats struct {
	master bool
	redisStats
}

// serverStats is a phase's INFO reading: on the single Redis its server
// (all); on the Cluster the masters' figures summed (all), the replicas'
// summed (replicas) and each node's (nodes, by address).
type serverStats struct {
	all, replicas redisStats
	nodes         map[string]nodeStats
}

// statsOn reads INFO memory, commandstats and cpu from the single Redis,
// or from every node of the Cluster.
func (e *Env) statsOn(onCluster bool) (serverStats, error) {
	if !onCluster {
		s, err := e.redisStats()
		return serverStats{all: s}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	nodes := map[string]nodeStats{}
	read := func(master bool) func(context.Context, *redis.Client) error {
		return func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "memory", "commandstats", "cpu").Result()
			if err != nil {
				return fmt.Errorf("INFO on %s: %w", c.Options().Addr, err)
			}
			mu.Lock()
			defer mu.Unlock()
			nodes[c.Options().Addr] = nodeStats{master: master, redisStats: parseStats(info)}
			return nil
		}
	}
	if err := e.Cluster.ForEachMaster(ctx, read(true)); err != nil {
		return serverStats{}, err
	}
	if err := e.Cluster.ForEachSlave(ctx, read(false)); err != nil {
		return serverStats{}, err
	}
	return serverStats{all: sumStats(nodes, true), replicas: sumStats(nodes, false), nodes: nodes}, nil
}

// sumStats adds up the masters' (master) or the replicas' readings.
func sumStats(nodes map[string]nodeStats, master bool) redisStats {
	s := redisStats{calls: map[string]int64{}, cmds: map[string]cmdStats{}}
	for _, n := range nodes {
		if n.master != master {
			continue
		}
		s.usedMemory += n.usedMemory
		s.cpu += n.cpu
		for cmd, c := range n.cmds {
			x := s.cmds[cmd]
			x.calls += c.calls
			x.usec += c.usec
			s.cmds[cmd] = x
			s.calls[cmd] += c.calls
		}
	}
	return s
}

// NodeCost is one Cluster node's share of a phase, per message.
type NodeCost struct {
	Addr string `json:"addr"`
	Role string `json:"role"` // master | replica
	// CPUus is the node's INFO cpu delta (used_cpu_sys + used_cpu_user).
	CPUus float64 `json:"cpu_us_per_msg"`
	// Calls are its INFO commandstats calls (the harness's INFO, SCAN and
	// MEMORY USAGE left out); a replica's are the writes it replays.
	Calls float64 `json:"calls_per_msg"`
	// Bytes is its used_memory delta.
	Bytes float64 `json:"bytes_per_msg"`
	// Partitions are, on a master, the state partitions whose slot it
	// serves (-1: not known).
	Partitions int `json:"state_partitions"`
}

// nodeCosts is each node's delta over n messages, masters first. A node
// missing from either reading (a failover or a node added meanwhile) is an
// error: the sum would not cover the phase.
func nodeCosts(before, after serverStats, n float64) ([]NodeCost, error) {
	if len(after.nodes) != len(before.nodes) {
		return nil, fmt.Errorf("the cluster had %d nodes before the phase and %d after", len(before.nodes), len(after.nodes))
	}
	var out []NodeCost
	for addr, a := range after.nodes {
		b, ok := before.nodes[addr]
		if !ok || b.master != a.master {
			return nil, fmt.Errorf("cluster node %s changed role or appeared during the phase", addr)
		}
		d := delta(b.redisStats, a.redisStats, n)
		role := "replica"
		if a.master {
			role = "master"
		}
		out = append(out, NodeCost{Addr: addr, Role: role, CPUus: round(d.cpu, 3), Calls: round(d.calls, 3),
			Bytes: round(d.bytes, 1), Partitions: -1})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Role != out[j].Role {
			return out[i].Role == "master"
		}
		return out[i].Addr < out[j].Addr
	})
	return out, nil
}

// masterOfSlot maps a hash slot to the address of the master serving it
// (CLUSTER SLOTS).
func (e *Env) masterOfSlot() (func(slot int) string, []string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	//lint:ignore SA1019 CLUSTER SLOTS lists each range's master first, which is all this needs; Redis 7.0 serves it
	slots, err := e.Cluster.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	var masters []string
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return nil, nil, fmt.Errorf("slots %d-%d have no master", s.Start, s.End)
		}
		if a := s.Nodes[0].Addr; !seen[a] {
			seen[a] = true
			masters = append(masters, a)
		}
	}
	sort.Strings(masters)
	return func(slot int) string {
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End {
				return s.Nodes[0].Addr
			}
		}
		return ""
	}, masters, nil
}

// statePartitionsOf counts, per master, the partitions of topic whose
// state (keys tagged {<topic>:<partition>}, internal/state) it holds.
func statePartitionsOf(master func(int) string, topic string, partitions int) map[string]int {
	out := map[string]int{}
	for p := 0; p < partitions; p++ {
		out[master(redisconn.Slot("{"+topic+":"+strconv.Itoa(p)+"}"))]++
	}
	return out
}

// spreadName returns name, or name-1, name-2, … : the first whose
// partitions' state slots land on every master as evenly as they can (the
// placement docs/operations.md tells an operator to check), so that a
// Cluster row measures every master. Without a Cluster it returns name.
// topicOf turns a candidate into the topic the state keys are tagged with.
func (e *Env) spreadName(name string, partitions int, topicOf func(string) string) (string, error) {
	if e.Cluster == nil {
		return name, nil
	}
	master, masters, err := e.masterOfSlot()
	if err != nil {
		return "", err
	}
	lo, hi := partitions/len(masters), (partitions+len(masters)-1)/len(masters)
	for i := 0; i < 10000; i++ {
		cand := name
		if i > 0 {
			cand = name + "-" + strconv.Itoa(i)
		}
		per := statePartitionsOf(master, topicOf(cand), partitions)
		even := len(per) == min(partitions, len(masters))
		for _, k := range per {
			even = even && k >= lo && k <= hi
		}
		if even {
			return cand, nil
		}
	}
	return name, nil
}

// addPartitions fills in each master's state partitions of topic.
func (e *Env) addPartitions(nodes []NodeCost, topic string, partitions int) error {
	master, _, err := e.masterOfSlot()
	if err != nil {
		return err
	}
	per := statePartitionsOf(master, topic, partitions)
	for i := range nodes {
		if nodes[i].Role == "master" {
			nodes[i].Partitions = per[nodes[i].Addr]
		}
	}
	return nil
}

// scanAll runs fn on the single Redis, or on every master of the Cluster
// (one at a time).
func (e *Env) scanAll(ctx context.Context, onCluster bool, fn func(ctx context.Context, c redis.UniversalClient) error) error {
	if !onCluster {
		return fn(ctx, e.Redis)
	}
	var mu sync.Mutex
	return e.Cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return fn(ctx, c)
	})
}

// clusterSummary is what a Cluster row reports beside the single row's
// fields: the masters' sum is the row's redis_* figures; the replicas'
// and each node's are here.
func clusterSummary(after serverStats, before serverStats, nodes []NodeCost, n float64) map[string]any {
	rep := delta(before.replicas, after.replicas, n)
	masters, replicas := 0, 0
	for _, nc := range nodes {
		if nc.Role == "master" {
			masters++
		} else {
			replicas++
		}
	}
	return map[string]any{"redis": "cluster", "masters": masters, "replicas": replicas, "nodes": nodes,
		"replica_cpu_us_per_msg": round(rep.cpu, 2), "replica_cmds_per_msg": round(rep.calls, 3),
		"replica_bytes_per_msg": round(rep.bytes, 1)}
}

// pairWith makes r, a Cluster row, name single, the single-Redis row of
// the same workload in the same run, as its baseline: ratio is msgs/s on
// the Cluster over msgs/s on the single Redis, and the single row's Redis
// CPU is copied beside the Cluster's.
func pairWith(r *Result, single Result) {
	r.Baseline, r.BaselineMsgsPerSec = single.Scenario, single.MsgsPerSec
	if single.MsgsPerSec > 0 {
		r.Ratio = round(r.MsgsPerSec/single.MsgsPerSec, 3)
	}
	if single.Extra == nil || r.Extra == nil {
		return
	}
	if c, ok := single.Extra["redis_cpu_us_per_msg"].(float64); ok {
		r.Extra["single_redis_cpu_us_per_msg"] = c
		if mc, ok := r.Extra["redis_cpu_us_per_msg"].(float64); ok && c > 0 {
			r.Extra["redis_cpu_ratio_vs_single"] = round(mc/c, 2)
		}
	}
}
