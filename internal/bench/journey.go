package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/state"
)

// WorkloadJourney is the state scenario's bucket journey (issue 43): the
// store as the consumer drives it (a lease's Marker, with the shipped
// config/production.yaml's dedup and processor settings, no edit) through
// the rates a deployment meets, each on partitions of its own, with
// WeChat send times advancing at the phase's rate (simulated time: a
// phase of minutes runs in seconds). Each row gives the bytes its marks
// keep a message (MEMORY USAGE of the phase's keys) and the buckets its
// partitions ended with.
const WorkloadJourney = "journey"

// journeyConfig is the configuration the journey runs with, relative to
// the repository root (where scripts/bench.sh runs the harness).
const journeyConfig = "config/production.yaml"

// journeyPhase is one stretch of a partition's traffic.
type journeyPhase struct {
	rate float64 // messages a second in the partition
	dur  time.Duration
}

// journeyRow is one row: partitions each fed phases in turn.
type journeyRow struct {
	name       string
	partitions int
	phases     []journeyPhase
}

// journeyRows are the rows: a desk's conversation pace (~10 msg/s a
// partition), the seeds' 5,000 msg/s over 12 partitions, and one
// partition at that pace whose rate jumps 10x for 10 minutes.
func journeyRows(scale float64) []journeyRow {
	m := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	return []journeyRow{
		{"desk_10_per_partition", 2, []journeyPhase{{10, m(60 * time.Minute)}}},
		{"5k_over_12", 2, []journeyPhase{{5000.0 / 12, m(10 * time.Minute)}}},
		{"jump_10x", 1, []journeyPhase{{5000.0 / 12, m(10 * time.Minute)}, {50000.0 / 12, m(10 * time.Minute)}, {5000.0 / 12, m(10 * time.Minute)}}},
	}
}

// stateJourney runs the bucket journey's rows (scale shortens every
// phase: 1 is the full journey).
func (e *Env) stateJourney(scale float64) ([]Result, error) {
	cfg, err := config.LoadConsumer(journeyConfig)
	if err != nil {
		return nil, fmt.Errorf("journey: %w", err)
	}
	var out []Result
	for _, row := range journeyRows(scale) {
		r, err := e.journeyRow(cfg, row)
		if err != nil {
			return out, fmt.Errorf("journey %s: %w", row.name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func (e *Env) journeyRow(cfg *config.Consumer, row journeyRow) (Result, error) {
	prefix := e.Prefix + ":journey-" + row.name + ":"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		unlinkPrefix(ctx, e.Redis, prefix+"*")
	}()
	st, err := state.New(ctx, state.Config{Client: e.Redis, KeyPrefix: prefix, Owner: "bench",
		Lease: cfg.Dedup.Lease, TTL: cfg.Dedup.TTL, Buckets: cfg.Dedup.Buckets})
	if err != nil {
		return Result{}, err
	}
	before, err := e.redisStats()
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	base := time.Now().Add(-24 * time.Hour).Unix() // send times in the past, within the TTL
	var total int
	var mu sync.Mutex
	ends := map[string]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, row.partitions)
	for p := range row.partitions {
		wg.Add(1)
		go func(p int32) {
			defer wg.Done()
			n, bk, err := journeyPartition(ctx, st, cfg, "journey", p, base, row.phases)
			mu.Lock()
			total += n
			ends[fmt.Sprint(p)] = bk
			mu.Unlock()
			errs <- err
		}(int32(p))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return Result{}, err
		}
	}
	elapsed := time.Since(start)
	after, err := e.redisStats()
	if err != nil {
		return Result{}, err
	}
	n := float64(total)
	kept, keys, err := e.keyBytes(false, prefix)
	if err != nil {
		return Result{}, err
	}
	d := delta(before, after, n)
	keyPerMsg := float64(kept) / n
	var phases []string
	for _, ph := range row.phases {
		phases = append(phases, fmt.Sprintf("%.0f msg/s for %s", ph.rate, ph.dur))
	}
	return Result{Scenario: "state_journey_" + row.name, Msgs: total, MsgsPerSec: round(n/elapsed.Seconds(), 0),
		Goal: "redis_key_bytes_per_msg <= 16", Pass: keyPerMsg <= 16,
		Extra: map[string]any{"workload": WorkloadJourney, "config": journeyConfig, "dedup.buckets": cfg.Dedup.Buckets,
			"partitions": row.partitions, "phases_per_partition": phases, "end_buckets_by_partition": ends,
			"redis_key_bytes_per_msg": round(keyPerMsg, 2), "redis_keys": keys,
			"redis_cmds_per_msg": round(d.calls, 3), "redis_calls_per_msg_by_command": d.perCmd,
			"redis_cpu_us_per_msg": round(d.cpu, 2),
			"note":                 "store-level, simulated time: a lease's Marker (the consumer's path) marks every message once, send times advancing at each phase's rate; key bytes the MEMORY USAGE sum of the row's keys; the INFO deltas (cmds, cpu) include whatever else the shared Redis served meanwhile"}}, nil
}

// journeyPartition marks the partition's messages phase after phase
// through a Marker, in chunks of a second of send time, and returns how
// many it marked and the bucket count of the last slot.
func journeyPartition(ctx context.Context, st *state.Store, cfg *config.Consumer, topic string, p int32, base int64, phases []journeyPhase) (int, int64, error) {
	l, err := st.Acquire(ctx, topic, p)
	if err != nil {
		return 0, 0, err
	}
	defer l.Release(ctx) //nolint:errcheck // best effort at the end
	m := l.NewMarker(max(cfg.Processor.PipelineFlush, time.Millisecond), cfg.Processor.PipelineMaxBatched)
	defer m.Close()
	n, sec := 0, int64(0)
	var carry float64
	var failed error
	var fmu sync.Mutex
	for _, ph := range phases {
		for s := int64(0); s < int64(ph.dur/time.Second); s++ {
			carry += ph.rate
			k := int(carry)
			carry -= float64(k)
			var wg sync.WaitGroup
			wg.Add(k)
			for i := range k {
				it := state.Item{Key: fmt.Sprintf("wk%030d:%08x-%04x-4000-8000-%012x", p, n+i, p, sec), SendTime: base + sec}
				m.Add(it, int64(n+i), func(err error) {
					if err != nil {
						fmu.Lock()
						failed = err
						fmu.Unlock()
					}
					wg.Done()
				})
			}
			wg.Wait()
			if failed != nil {
				return n, 0, failed
			}
			n += k
			sec++
		}
	}
	return n, int64(l.Buckets(base + sec - 1)), nil
}
