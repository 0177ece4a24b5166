package bench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
)

// StateOptions sizes the consumer-state scenario.
type StateOptions struct {
	Msgs       int
	Users      int
	Partitions int
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
	cpu        time.Duration
}

func (e *Env) redisStats() (redisStats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := e.Redis.Info(ctx, "memory", "commandstats").Result()
	if err != nil {
		return redisStats{}, err
	}
	s := redisStats{calls: map[string]int64{}, cpu: e.RedisCPU()}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_memory":
			s.usedMemory, _ = strconv.ParseInt(v, 10, 64)
		case strings.HasPrefix(k, "cmdstat_"):
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					s.calls[strings.TrimPrefix(k, "cmdstat_")], _ = strconv.ParseInt(n, 10, 64)
				}
			}
		}
	}
	return s, nil
}

// memoryAfterExpiry waits d, lets Redis drop the keys that expired
// meanwhile (a SCAN of the keyspace deletes every expired key it meets),
// and returns used_memory.
func (e *Env) memoryAfterExpiry(d time.Duration) (int64, error) {
	time.Sleep(d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cursor uint64
	for {
		_, next, err := e.Redis.Scan(ctx, cursor, "", 10000).Result()
		if err != nil {
			return 0, err
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	st, err := e.redisStats()
	return st.usedMemory, err
}

// State measures what the consumer's dedup state costs Redis per message:
// one topic of o.Msgs messages over o.Users users, read by the raw loop and
// then by the full schedule-consumer with dedup.store claims and with
// leases, each in its own group and key prefix, in the same run. Per store:
// the Redis memory still held once the consumer closed and its transient
// keys expired (what stays for the dedup TTL; INFO memory), the Redis
// commands per message (INFO commandstats, every call including those a
// script makes) and Redis CPU per message (INFO cpu), and this process's
// CPU per message against the raw loop's.
func State(e *Env, o StateOptions) ([]Result, error) {
	topic, err := e.Topic("state", o.Partitions)
	if err != nil {
		return nil, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return nil, err
	}
	msgs := StateMessages(e.Prefix+"-s", o.Msgs, o.Users)
	size := WireSize(msgs)
	if err := Prefill(kcfg, topic, msgs); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	msgs = nil
	cpu0 := CPUTime()
	_, rawRate, err := rawConsume(kcfg, e.Prefix+"-raw-state", topic, o.Msgs, 3*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("raw_consume: %w", err)
	}
	rawCPU := float64((CPUTime() - cpu0).Microseconds()) / float64(o.Msgs)
	var out []Result
	for _, store := range []string{"claims", "leases"} {
		before, err := e.redisStats()
		if err != nil {
			return nil, err
		}
		ph, err := e.pipelinePhase("state-"+store, topic, ConsumerOptions{Msgs: o.Msgs, Users: o.Users, Partitions: o.Partitions,
			Mutate: func(c *config.Consumer) { c.Dedup.Store = store }})
		if err != nil {
			return nil, err
		}
		after, err := e.redisStats()
		if err != nil {
			return nil, err
		}
		// What stays is read once the transient keys (claims in flight,
		// leases not given back) have expired: a lease after the shipped
		// dedup.lease, dropped by Redis when a SCAN meets it.
		if after.usedMemory, err = e.memoryAfterExpiry(config.DefaultDedupLease + time.Second); err != nil {
			return nil, err
		}
		n := float64(o.Msgs)
		var calls int64
		perCmd := map[string]float64{}
		for cmd, c := range after.calls {
			d := c - before.calls[cmd]
			if d <= 0 || cmd == "info" {
				continue
			}
			calls += d
			perCmd[cmd] = round(float64(d)/n, 3)
		}
		bytesPerMsg := float64(after.usedMemory-before.usedMemory) / n
		cmdsPerMsg := float64(calls) / n
		redisCPU := float64((after.cpu - before.cpu).Microseconds()) / n
		cpu := float64(ph.cpu.Microseconds()) / n
		cmdNames := make([]string, 0, len(perCmd))
		for c := range perCmd {
			cmdNames = append(cmdNames, c)
		}
		sort.Strings(cmdNames)
		goal := "redis_bytes_per_msg <= 24 and redis_cmds_per_msg <= 1.2 and redis_cpu_us_per_msg <= 2.5"
		out = append(out, Result{Scenario: "state_" + store, Msgs: o.Msgs, MsgsPerSec: round(ph.rate, 0),
			Baseline: "raw_consume", BaselineMsgsPerSec: round(rawRate, 0), Ratio: round(ph.rate/rawRate, 3),
			RSSMiB: ph.rss, Goal: goal, Pass: bytesPerMsg <= 24 && cmdsPerMsg <= 1.2 && redisCPU <= 2.5,
			Extra: map[string]any{"users": o.Users, "partitions": o.Partitions, "bytes_per_msg": round(size, 0),
				"redis_bytes_per_msg": round(bytesPerMsg, 1), "redis_cmds_per_msg": round(cmdsPerMsg, 3),
				"redis_calls_per_msg_by_command": perCmd, "commands": cmdNames,
				"redis_cpu_us_per_msg": round(redisCPU, 2), "cpu_us_per_msg": round(cpu, 2),
				"raw_cpu_us_per_msg": round(rawCPU, 2), "cpu_ratio_to_raw": round(cpu/rawCPU, 2),
				"note": "redis figures are INFO deltas around the phase (memory once the consumer closed and dedup.lease passed: what stays for dedup.ttl); calls include those made inside scripts",
				"path": "service.StartConsumer with dedup.store=" + store}})
	}
	return out, nil
}
