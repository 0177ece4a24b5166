package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

// PeerOptions configures the peer scenario.
type PeerOptions struct {
	Msgs, Users, Partitions int
	// Jar is Confluent Parallel Consumer's runner (bench/pc-peer, built by
	// scripts/bench.sh with Maven); Concurrency its max concurrency.
	Jar         string
	Concurrency int
}

// pcRun is what the Parallel Consumer runner prints.
type pcRun struct {
	Count          int64   `json:"count"`
	MsgsPerSec     float64 `json:"msgs_per_sec"`
	FromStart      float64 `json:"from_start_msgs_per_sec"`
	CPUSeconds     float64 `json:"cpu_s"`
	MaxConcurrency int     `json:"max_concurrency"`
}

// Peer pre-fills one topic and reads all of it four times, each from the
// start with a group of its own, in this order: the raw ReadMessage loop
// (the physical limit), Confluent's Parallel Consumer (KEY ordering, a
// no-op function, in its own JVM), kfpipe's bare consumer (no dedup,
// limiter, breaker) and kfpipe's full schedule-consumer (no-op handler).
// Every rate is from the first record to the last; the ratios are against
// the Parallel Consumer of the same run.
func Peer(e *Env, o PeerOptions) ([]Result, error) {
	topic, err := e.Topic("peer", o.Partitions)
	if err != nil {
		return nil, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return nil, err
	}
	if err := Prefill(kcfg, topic, Messages(e.Prefix+"-p", o.Msgs, o.Users)); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}

	cpu0 := CPUTime()
	_, rawRate, err := rawConsume(kcfg, e.Prefix+"-peer-raw", topic, o.Msgs, 3*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("raw_consume: %w", err)
	}
	rawCPU := CPUTime() - cpu0

	var out, stderr bytes.Buffer
	cmd := exec.Command("java", "-jar", o.Jar, kcfg.Brokers, topic, e.Prefix+"-peer-pc", strconv.Itoa(o.Msgs), strconv.Itoa(o.Concurrency))
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("parallel consumer: %w: %s", err, stderr.String())
	}
	var pc pcRun
	if err := json.Unmarshal(out.Bytes(), &pc); err != nil {
		return nil, fmt.Errorf("parallel consumer output %q: %w", out.String(), err)
	}

	perMsg := func(d time.Duration) float64 { return round(float64(d.Microseconds())/float64(o.Msgs), 2) }
	common := map[string]any{"users": o.Users, "partitions": o.Partitions,
		"raw_msgs_per_sec": round(rawRate, 0), "raw_cpu_us_per_msg": perMsg(rawCPU),
		"pc_msgs_per_sec": round(pc.MsgsPerSec, 0), "pc_cpu_us_per_msg": round(pc.CPUSeconds*1e6/float64(o.Msgs), 2),
		"pc_max_concurrency": pc.MaxConcurrency}
	results := []Result{{Scenario: "peer_parallel_consumer", Msgs: o.Msgs, MsgsPerSec: round(pc.MsgsPerSec, 0),
		Baseline: "raw_consume", BaselineMsgsPerSec: round(rawRate, 0), Ratio: round(pc.MsgsPerSec/rawRate, 3),
		Extra: merged(common, map[string]any{"from_start_msgs_per_sec": round(pc.FromStart, 0),
			"what": "Confluent Parallel Consumer 0.5.3.2, KEY ordering, no-op function, periodic async commits"})}}
	for _, v := range []struct {
		name string
		bare bool
		goal float64
	}{{"peer_kfpipe_bare", true, 2}, {"peer_kfpipe_pipeline", false, 1}} {
		// Each in its own group (the phase's name): a group that had read
		// the topic would start at its end.
		ph, err := e.pipelinePhase(strings.ReplaceAll(v.name, "_", "-"), topic, ConsumerOptions{Msgs: o.Msgs, Users: o.Users,
			Partitions: o.Partitions, Bare: v.bare, Mutate: func(c *config.Consumer) {
			}})
		if err != nil {
			return nil, err
		}
		results = append(results, Result{Scenario: v.name, Msgs: o.Msgs, MsgsPerSec: round(ph.rate, 0),
			Baseline: "peer_parallel_consumer", BaselineMsgsPerSec: round(pc.MsgsPerSec, 0), Ratio: round(ph.rate/pc.MsgsPerSec, 3),
			RSSMiB: ph.rss, Goal: fmt.Sprintf("ratio >= %g (issue #14)", v.goal), Pass: ph.rate/pc.MsgsPerSec >= v.goal,
			Extra: merged(common, map[string]any{"raw_ratio": round(ph.rate/rawRate, 3), "from_start_msgs_per_sec": round(ph.fromStart, 0),
				"cpu_us_per_msg": perMsg(ph.cpu), "redis_cpu_us_per_msg": perMsg(ph.redisCPU)})})
	}
	return results, nil
}

// merged returns a copy of a with b's entries added.
func merged(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
