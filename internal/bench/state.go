package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/state"
)

// StateOptions sizes the consumer-state scenario.
type StateOptions struct {
	Msgs       int
	Users      int // dense workload: users (100 messages each at 1M)
	Partitions int
	// Workloads to run, of dense, conversation, write-once (all when empty).
	Workloads []string
	// NoOld skips the full pipeline (the old stores' baselines before
	// they were deleted).
	NoOld bool
	// Legacy are the dedup.legacy modes the full pipeline runs with, in
	// turn (off when empty).
	Legacy []string
	// Cluster are the workloads that also run on the Redis Cluster
	// (Env.ConnectCluster), right after the single-Redis rows of the same
	// workload, on the same messages (the same topic for the pipeline):
	// none when empty or without a Cluster.
	Cluster []string
}

// StateMessages are Messages with realistic WeChat identifiers — a
// 32-character open_kfid and a 36-character msgid, as the dedup keys of a
// real deployment — since the per-message store's cost grows with them.
func StateMessages(tag string, n, users int) []*chatmsg.ChatMessage {
	msgs := Messages(tag, n, users)
	kf := "wk" + strings.Repeat("K", 30)
	for i, m := range msgs {
		m.OpenKfID = kf
		m.UpstreamMsgID = fmt.Sprintf("%08x-%04x-4000-8000-%012x", i, len(tag), i)
	}
	return msgs
}

// redisStats is what the scenario reads from Redis before and after a
// phase.
type redisStats struct {
	usedMemory int64
	calls      map[string]int64 // INFO commandstats calls per command
	cmds       map[string]cmdStats
	cpu        time.Duration
}

func (e *Env) redisStats() (redisStats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := e.Redis.Info(ctx, "memory", "commandstats", "cpu").Result()
	if err != nil {
		return redisStats{}, err
	}
	return parseStats(info), nil
}

// parseStats reads used_memory, the commandstats and used_cpu_sys +
// used_cpu_user of an INFO reply.
func parseStats(info string) redisStats {
	s := redisStats{calls: map[string]int64{}, cmds: map[string]cmdStats{}}
	var cpu float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_memory":
			s.usedMemory, _ = strconv.ParseInt(v, 10, 64)
		case k == "used_cpu_user", k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		case strings.HasPrefix(k, "cmdstat_"):
			cmd := strings.TrimPrefix(k, "cmdstat_")
			cs := parseCmdStat(v)
			s.calls[cmd], s.cmds[cmd] = cs.calls, cs
		}
	}
	s.cpu = time.Duration(cpu * float64(time.Second))
	return s
}

// parseCmdStat reads the calls and usec of one INFO commandstats value
// ("calls=3,usec=12,usec_per_call=4.00,…"); a field missing or malformed
// reads 0.
func parseCmdStat(v string) cmdStats {
	var cs cmdStats
	for _, f := range strings.Split(v, ",") {
		if n, ok := strings.CutPrefix(f, "calls="); ok {
			cs.calls, _ = strconv.ParseInt(n, 10, 64)
		} else if n, ok := strings.CutPrefix(f, "usec="); ok {
			cs.usec, _ = strconv.ParseInt(n, 10, 64)
		}
	}
	return cs
}

// memoryAfterExpiry waits d, lets Redis drop the keys that expired
// meanwhile (a SCAN of the keyspace deletes every expired key it meets; on
// the Cluster of every master's), and reads the servers' INFO.
func (e *Env) memoryAfterExpiry(onCluster bool, d time.Duration) (serverStats, error) {
	time.Sleep(d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := e.scanAll(ctx, onCluster, func(ctx context.Context, c redis.UniversalClient) error {
		var cursor uint64
		for {
			_, next, err := c.Scan(ctx, cursor, "", 10000).Result()
			if err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
	if err != nil {
		return serverStats{}, err
	}
	return e.statsOn(onCluster)
}

// withMemory is after with the used memory of mem (read once the
// transient keys expired), server by server.
func withMemory(after, mem serverStats) serverStats {
	after.all.usedMemory, after.replicas.usedMemory = mem.all.usedMemory, mem.replicas.usedMemory
	for addr, n := range after.nodes {
		if m, ok := mem.nodes[addr]; ok {
			n.usedMemory = m.usedMemory
			after.nodes[addr] = n
		}
	}
	return after
}

// Workloads of the state scenario.
const (
	WorkloadDense        = "dense"
	WorkloadConversation = "conversation"
	WorkloadWriteOnce    = "write-once"
)

// stateSendRate is the send rate the workloads' send times are spread at
// (messages per second): it sizes the new store's buckets.
const stateSendRate = 5000

// conversationGap is the mean gap, in stream positions, between two
// messages of a user in the conversation workload: at the old leases
// store's pipeline rate (~10-25k msg/s) most gaps exceed the scaled
// dedup.lease of 1 s, as a live conversation's gaps of seconds to minutes
// exceed the shipped 10 s lease.
const conversationGap = 60000

// WorkloadMessages returns n messages of a workload in stream order, with
// WeChat-sized ids and send times spread at stateSendRate:
//   - dense: users users, each user's messages back to back in rounds
//     (message i is user i%users) — today's state scenario;
//   - conversation: users sending 3-12 messages, the gaps between a
//     user's messages drawn exponentially (mean conversationGap positions);
//   - write-once: as many users as messages.
func WorkloadMessages(tag, workload string, n, users int, seed int64) ([]*chatmsg.ChatMessage, int, error) {
	rng := rand.New(rand.NewSource(seed))
	userOf := make([]int, n)
	switch workload {
	case WorkloadDense:
		for i := range userOf {
			userOf[i] = i % users
		}
	case WorkloadWriteOnce:
		perm := rng.Perm(n)
		copy(userOf, perm)
		users = n
	case WorkloadConversation:
		type ev struct {
			pos  float64
			user int
		}
		evs := make([]ev, 0, n+12)
		users = 0
		for len(evs) < n {
			c := 3 + rng.Intn(10)
			pos := rng.Float64() * float64(n)
			for j := 0; j < c && len(evs) < n; j++ {
				evs = append(evs, ev{pos, users})
				pos += rng.ExpFloat64() * conversationGap
			}
			users++
		}
		sort.Slice(evs, func(a, b int) bool { return evs[a].pos < evs[b].pos })
		for i := range userOf {
			userOf[i] = evs[i].user
		}
	default:
		return nil, 0, fmt.Errorf("workload must be one of %s, %s, %s; got %q", WorkloadDense, WorkloadConversation, WorkloadWriteOnce, workload)
	}
	kf := "wk" + strings.Repeat("K", 30)
	pad := strings.Repeat("x", 14)
	out := make([]*chatmsg.ChatMessage, n)
	for i := range out {
		m := Message(tag, i, UserName(userOf[i]), pad)
		m.OpenKfID = kf
		m.UpstreamMsgID = fmt.Sprintf("%08x-%04x-4000-8000-%012x", i, len(tag), i)
		m.SendTime = 1700000000 + int64(i)/stateSendRate
		out[i] = m
	}
	return out, users, nil
}

// redisDelta is what a phase cost Redis, per message.
type redisDelta struct {
	bytes, calls, cpu float64
	perCmd            map[string]float64
	cmds              []string
}

func delta(before, after redisStats, n float64) redisDelta {
	d := redisDelta{perCmd: map[string]float64{}}
	var calls int64
	for cmd, c := range after.calls {
		x := c - before.calls[cmd]
		if x <= 0 || cmd == "info" || cmd == "scan" || cmd == "memory|usage" {
			continue
		}
		calls += x
		d.perCmd[cmd] = round(float64(x)/n, 3)
		d.cmds = append(d.cmds, cmd)
	}
	sort.Strings(d.cmds)
	d.bytes = float64(after.usedMemory-before.usedMemory) / n
	d.calls = float64(calls) / n
	d.cpu = float64((after.cpu - before.cpu).Microseconds()) / n
	return d
}

const stateGoal = "redis_bytes_per_msg <= 16 and redis_cmds_per_msg <= 1.5 and redis_cpu_us_per_msg <= 3"

func (d redisDelta) pass() bool { return d.bytes <= 16 && d.calls <= 1.5 && d.cpu <= 3 }

// State measures what the consumer's state costs Redis per message in
// three workloads (dense, conversation, write-once; see WorkloadMessages):
// the per-partition store (package state) driven as the consumer drives
// it, then the full schedule-consumer on it, once per dedup.legacy mode of
// o.Legacy, each in its own group and key prefix. Per phase: the Redis
// memory still held once transient keys expired (INFO memory), the Redis
// commands per message (INFO commandstats, every call including those a
// script makes) and Redis CPU per message (INFO cpu); for the pipeline
// also each part's own share (statePipeline).
func State(e *Env, o StateOptions) ([]Result, error) {
	wls := o.Workloads
	if len(wls) == 0 {
		wls = []string{WorkloadDense, WorkloadConversation, WorkloadWriteOnce, WorkloadJourney}
	}
	var out []Result
	msgsOf := map[string][]*chatmsg.ChatMessage{}
	usersOf := map[string]int{}
	// The store-level phase first, for every workload (seconds), then
	// the pipelines (minutes each on a loaded box); a pipeline that fails
	// is reported and the next one still runs.
	for _, wl := range wls {
		if wl == WorkloadJourney {
			rows, err := e.stateJourney(1)
			out = append(out, rows...)
			if err != nil {
				return out, err
			}
			continue
		}
		msgs, users, err := WorkloadMessages(e.Prefix+"-"+wl, wl, o.Msgs, o.Users, 30)
		if err != nil {
			return out, err
		}
		msgsOf[wl], usersOf[wl] = msgs, users
		r, err := e.statePartitioned(wl, msgs, users, o.Partitions, false)
		if err != nil {
			return out, fmt.Errorf("%s: new store: %w", wl, err)
		}
		out = append(out, r)
		if o.onCluster(e, wl) {
			rc, err := e.statePartitioned(wl, msgs, users, o.Partitions, true)
			if err != nil {
				return out, fmt.Errorf("%s: new store on the cluster: %w", wl, err)
			}
			pairWith(&rc, r)
			out = append(out, rc)
		}
	}
	if o.NoOld {
		return out, nil
	}
	var errs []error
	for _, wl := range wls {
		if wl == WorkloadJourney {
			continue // store-level only
		}
		old, err := e.statePipeline(wl, msgsOf[wl], usersOf[wl], o)
		out = append(out, old...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", wl, err))
		}
		delete(msgsOf, wl)
	}
	return out, errors.Join(errs...)
}

// onCluster reports whether workload wl runs on the Cluster too.
func (o StateOptions) onCluster(e *Env, wl string) bool {
	if e.Cluster == nil {
		return false
	}
	for _, w := range o.Cluster {
		if w == wl {
			return true
		}
	}
	return false
}

// statePipeline runs the full schedule-consumer on msgs, once per
// dedup.legacy mode of o.Legacy (and, for a workload of o.Cluster, on the
// Cluster right after each), and reports beside the whole pipeline's
// Redis figures each part's own (see attribute): the per-partition
// store's, the rate limiter's and the legacy read's.
func (e *Env) statePipeline(wl string, msgs []*chatmsg.ChatMessage, users int, o StateOptions) ([]Result, error) {
	// The topic's name decides the state's slots on a Cluster: one that
	// spreads the partitions over every master (the same topic for both
	// rows).
	kind, err := e.spreadName("state-"+wl, o.Partitions, func(k string) string { return e.Prefix + "-" + k })
	if err != nil {
		return nil, err
	}
	topic, err := e.Topic(kind, o.Partitions)
	if err != nil {
		return nil, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return nil, err
	}
	if err := Prefill(kcfg, topic, msgs); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	// dedup.buckets sized for the workload's rate, as docs/operations.md
	// tells an operator to.
	buckets := state.SuggestBuckets(stateSendRate, o.Partitions, state.DefaultSlot)
	modes := o.Legacy
	if len(modes) == 0 {
		modes = []string{"off"}
	}
	var out []Result
	for _, mode := range modes {
		r, err := e.pipelineRow(wl, topic, mode, len(msgs), users, buckets, o, false)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		if o.onCluster(e, wl) {
			rc, err := e.pipelineRow(wl, topic, mode, len(msgs), users, buckets, o, true)
			if err != nil {
				return out, err
			}
			if r.Extra["error"] == nil {
				pairWith(&rc, r)
			}
			out = append(out, rc)
		}
	}
	return out, nil
}

// pipelineRow is one run of the full schedule-consumer over topic (nmsgs
// messages) with dedup.legacy mode, in its own group and key prefix, on
// the single Redis or on the Cluster. A phase that fails is reported in
// the row (extra.error) with a nil error.
func (e *Env) pipelineRow(wl, topic, mode string, nmsgs, users, buckets int, o StateOptions, onCluster bool) (Result, error) {
	lease := config.DefaultDedupLease
	name := "state-" + wl + "-legacy-" + mode
	scenario := "state_" + wl + "_pipeline_legacy_" + mode
	redisKind := "single"
	if onCluster {
		name, scenario, redisKind = name+"-cluster", scenario+"_cluster", "cluster"
	}
	prefix := e.Prefix + ":" + name + ":"
	before, err := e.statsOn(onCluster)
	if err != nil {
		return Result{}, err
	}
	stop := e.countCalls(prefix)
	ph, err := e.pipelinePhase(name, topic, ConsumerOptions{Msgs: nmsgs, Users: users, Partitions: o.Partitions,
		Limit: 12 * time.Minute, Cluster: onCluster,
		Mutate: func(c *config.Consumer) { c.Dedup.Legacy, c.Dedup.Buckets = mode, buckets }})
	client := stop()
	if err != nil {
		return Result{Scenario: scenario, Msgs: nmsgs, Goal: stateGoal,
			Extra: map[string]any{"workload": wl, "dedup_legacy": mode, "redis": redisKind, "error": err.Error()}}, nil
	}
	after, err := e.statsOn(onCluster)
	if err != nil {
		return Result{}, err
	}
	// What stays is read once the transient keys have expired.
	mem, err := e.memoryAfterExpiry(onCluster, lease+time.Second)
	if err != nil {
		return Result{}, err
	}
	after = withMemory(after, mem)
	n := float64(nmsgs)
	d := delta(before.all, after.all, n)
	parts := attribute(commandDelta(before.all.cmds, after.all.cmds), client, scriptInner, n)
	for part, kp := range map[string][]string{PartStore: {prefix + "st:"}, PartLimiter: {prefix + "rl:", prefix + "{rl}:"}, PartLegacy: {prefix + "dedup:"}} {
		var kept int64
		for _, p := range kp {
			b, _, err := e.keyBytes(onCluster, p)
			if err != nil {
				return Result{}, err
			}
			kept += b
		}
		c := parts[part]
		if c == nil {
			c = &partCost{ByCommand: map[string]float64{}}
			parts[part] = c
		}
		c.Bytes = round(float64(kept)/n, 2)
	}
	st := parts[PartStore]
	// Another client's scripts make inner calls too: those of the
	// commands the store's scripts call are charged to the store.
	foreignScripts := false
	if el := parts[PartElsewhere]; el != nil {
		foreignScripts = el.ByCommand["evalsha"]+el.ByCommand["eval"] > 0
	}
	note := "full pipeline (service.StartConsumer, no-op handler). redis_* are whole-server INFO deltas around the phase (memory once dedup.lease passed; cpu is INFO cpu: execution, network I/O and event loop; other clients of a shared Redis included). parts splits them by key prefix as the harness's client counted the commands: calls include the script-internal ones, cmd_usec_per_msg is INFO commandstats usec (execution only; a script's usec holds its inner commands), key_bytes_per_msg the MEMORY USAGE sum of the part's keys"
	extra := map[string]any{"workload": wl, "users": users, "partitions": o.Partitions, "dedup_legacy": mode, "redis": redisKind,
		"parts": parts, "other_clients_ran_scripts": foreignScripts,
		"redis_bytes_per_msg": round(d.bytes, 1), "redis_cmds_per_msg": round(d.calls, 3),
		"redis_calls_per_msg_by_command": d.perCmd, "commands": d.cmds,
		"redis_cpu_us_per_msg": round(d.cpu, 2), "cpu_us_per_msg": round(float64(ph.cpu.Microseconds())/n, 2),
		"note": note, "path": "service.StartConsumer, dedup.legacy=" + mode}
	if onCluster {
		nodes, err := nodeCosts(before, after, n)
		if err != nil {
			return Result{}, err
		}
		if err := e.addPartitions(nodes, topic, o.Partitions); err != nil {
			return Result{}, err
		}
		extra = merged(extra, clusterSummary(after, before, nodes, n))
		extra["note"] = note + ". On the Cluster (redis.mode: cluster) redis_* are the masters' INFO deltas summed, nodes each node's (masters' state_partitions: the partitions whose state slot it serves), replica_* the replicas' summed"
		extra["path"] = "service.StartConsumer, redis.mode=cluster, dedup.legacy=" + mode
	}
	return Result{Scenario: scenario, Msgs: nmsgs, MsgsPerSec: round(ph.rate, 0),
		RSSMiB: ph.rss, Goal: stateStoreGoal, Pass: st.pass(), Extra: extra}, nil
}

// stateStoreGoal is issue 30's goal, applied to the store's own share of a
// full pipeline (parts.store): its CPU is commandstats usec.
const stateStoreGoal = "parts.store: key_bytes_per_msg <= 16 and calls_per_msg <= 1.5 and cmd_usec_per_msg <= 3"

func (c *partCost) pass() bool {
	return c != nil && c.Bytes >= 0 && c.Bytes <= 16 && c.Calls <= 1.5 && c.CPUus <= 3
}

// stateBatch is the new store's mark batch: what one poll of a partition
// hands the consumer at these rates.
const stateBatch = 500

// statePartitioned drives the per-partition store over msgs as the
// consumer does: per partition, owner A takes the lease, marks the
// partition's messages a batch per call, commits two batches behind, and
// gives the partition back half-way (a rebalance); owner B takes it,
// looks up the messages from the committed offset to A's recorded
// high-water (the only possible repeats), skips those found done, and
// marks the rest. Every message must be handled exactly once.
//
// onCluster runs it on the Cluster: the Redis figures are then the
// masters' summed, with each node's and the replicas' beside them.
func (e *Env) statePartitioned(wl string, msgs []*chatmsg.ChatMessage, users, partitions int, onCluster bool) (Result, error) {
	parts := make([][]state.Item, partitions)
	for _, m := range msgs {
		p := int(xxhash.Sum64String(m.ExternalUserID) % uint64(partitions))
		parts[p] = append(parts[p], state.Item{Key: m.DedupKey(), SendTime: m.SendTime})
	}
	slot := state.DefaultSlot
	buckets := state.SuggestBuckets(stateSendRate, partitions, slot)
	// The state's tag is {<topic>:<partition>}: a label that spreads the
	// partitions over the Cluster's masters (the same on both rows).
	topic, err := e.spreadName("state", partitions, func(k string) string { return k })
	if err != nil {
		return Result{}, err
	}
	cfg := func(owner string) state.Config {
		return state.Config{Client: e.client(onCluster), KeyPrefix: e.Prefix + ":ns-" + wl + ":", Owner: owner,
			Lease: state.DefaultLease, TTL: 169 * time.Hour, Slot: slot, Buckets: buckets}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, err := state.New(ctx, cfg("bench-a"))
	if err != nil {
		return Result{}, err
	}
	b, err := state.New(ctx, cfg("bench-b"))
	if err != nil {
		return Result{}, err
	}
	before, err := e.statsOn(onCluster)
	if err != nil {
		return Result{}, err
	}
	cpu0 := CPUTime()
	start := time.Now()
	var lookedUp, skipped, handled atomic.Int64
	errs := make(chan error, partitions)
	var wg sync.WaitGroup
	for p := range parts {
		wg.Add(1)
		go func(p int, items []state.Item) {
			defer wg.Done()
			errs <- runPartition(ctx, a, b, topic, int32(p), items, &lookedUp, &skipped, &handled)
		}(p, parts[p])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return Result{}, err
		}
	}
	elapsed := time.Since(start)
	cpu := CPUTime() - cpu0
	after, err := e.statsOn(onCluster)
	if err != nil {
		return Result{}, err
	}
	n := float64(len(msgs))
	if handled.Load() != int64(len(msgs)) {
		return Result{}, fmt.Errorf("handled %d of %d messages (a repeat ran or a message was skipped)", handled.Load(), len(msgs))
	}
	kept, keys, err := e.keyBytes(onCluster, e.Prefix+":ns-"+wl+":")
	if err != nil {
		return Result{}, err
	}
	d := delta(before.all, after.all, n)
	scenario, redisKind := "state_"+wl+"_partition", "single"
	var cl map[string]any
	if onCluster {
		scenario, redisKind = scenario+"_cluster", "cluster"
		nodes, err := nodeCosts(before, after, n)
		if err != nil {
			return Result{}, err
		}
		if err := e.addPartitions(nodes, topic, partitions); err != nil {
			return Result{}, err
		}
		cl = clusterSummary(after, before, nodes, n)
	}
	return Result{Scenario: scenario, Msgs: len(msgs), MsgsPerSec: round(n/elapsed.Seconds(), 0),
		Goal: stateGoal, Pass: d.pass(),
		Extra: merged(cl, map[string]any{"workload": wl, "redis": redisKind, "state_topic": topic, "users": users, "partitions": partitions, "buckets": buckets, "slot": slot.String(),
			"mark_batch": stateBatch, "looked_up": lookedUp.Load(), "found_done": skipped.Load(),
			"redis_bytes_per_msg": round(d.bytes, 1), "redis_key_bytes_per_msg": round(float64(kept)/n, 2), "redis_keys": keys,
			"redis_cmds_per_msg": round(d.calls, 3), "redis_calls_per_msg_by_command": d.perCmd, "commands": d.cmds,
			"redis_cpu_us_per_msg": round(d.cpu, 2), "cpu_us_per_msg": round(float64(cpu.Microseconds())/n, 2),
			"note": "store-level: package state driven as the consumer drives it (no Kafka); msgs_per_sec is the store's rate, not the pipeline's; redis figures are INFO deltas around the phase, key bytes the MEMORY USAGE sum of the store's keys",
			"path": "state.Store: Acquire, Mark per batch, Release; Seen for the new owner's possible repeats"})}, nil
}

func runPartition(ctx context.Context, a, b *state.Store, topic string, p int32, items []state.Item, lookedUp, skipped, handled *atomic.Int64) error {
	half := len(items) / 2
	la, err := a.Acquire(ctx, topic, p)
	if err != nil {
		return err
	}
	for i := 0; i < half; i += stateBatch {
		j := min(i+stateBatch, half)
		handled.Add(int64(j - i))
		if err := la.Mark(ctx, int64(j-1), items[i:j]); err != nil {
			return err
		}
	}
	committed := max(0, half-2*stateBatch)
	if err := la.Release(ctx); err != nil {
		return err
	}
	lb, err := b.Acquire(ctx, topic, p)
	if err != nil {
		return err
	}
	defer lb.Release(ctx) //nolint:errcheck // best effort at the end
	for i := committed; i < len(items); i += stateBatch {
		j := min(i+stateBatch, len(items))
		batch := items[i:j]
		var fresh []state.Item
		if lb.MayRepeat(int64(i)) {
			rep := j - i
			for rep > 0 && !lb.MayRepeat(int64(i+rep-1)) {
				rep--
			}
			seen, err := lb.Seen(ctx, batch[:rep])
			if err != nil {
				return err
			}
			lookedUp.Add(int64(rep))
			for k, s := range seen {
				if s {
					skipped.Add(1)
				} else {
					fresh = append(fresh, batch[k])
				}
			}
			fresh = append(fresh, batch[rep:]...)
		} else {
			fresh = batch
		}
		handled.Add(int64(len(fresh)))
		if err := lb.Mark(ctx, int64(j-1), fresh); err != nil {
			return err
		}
	}
	return nil
}

// keyBytes sums MEMORY USAGE over the keys under prefix, on the single
// Redis or on every master of the Cluster.
func (e *Env) keyBytes(onCluster bool, prefix string) (int64, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var total int64
	n := 0
	err := e.scanAll(ctx, onCluster, func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			m, err := c.MemoryUsage(ctx, iter.Val(), 0).Result()
			if err != nil {
				return err
			}
			total += m
			n++
		}
		return iter.Err()
	})
	return total, n, err
}
