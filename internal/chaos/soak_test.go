//go:build soak

package chaos

import (
	"context"
	"encoding/csv"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestSoak is `make soak` (build tag soak: never in make test or make chaos): the
// pipeline at a steady rate (KFPIPE_SOAK_RATE, default 2000 msg/s) for
// KFPIPE_SOAK_DURATION (default 30m), with 5 % of handler attempts
// failing and a bot the rate limiter blocks. Every 10 s it samples each
// daemon's RSS, Go heap in use, goroutines and open file descriptors, the
// Redis memory and keys, and the consumers' lag, into KFPIPE_SOAK_OUT
// (default .run/soak.csv; scripts/soak-plot.py draws docs/soak.png). It
// passes when lost=0 dup=0 reordered=0 and no series but Redis grows
// after the warm-up (the first third): a least-squares slope of at most
// 10 % of the series' mean per hour (goroutines and FDs: 5 an hour, lag: a
// second of messages an hour). Redis grows by
// design — one dedup mark per processed message for dedup.ttl (issue #14)
// — so its bytes per processed message are reported, not judged flat.
func TestSoak(t *testing.T) {
	svc := NeedServices(t)
	rate := envFloat(t, "KFPIPE_SOAK_RATE", 2000)
	dur, err := time.ParseDuration(envOr("KFPIPE_SOAK_DURATION", "30m"))
	if err != nil {
		t.Fatalf("KFPIPE_SOAK_DURATION: %v", err)
	}
	warm := dur / 3
	out := envOr("KFPIPE_SOAK_OUT", filepath.Join(testenv.RepoRoot(t), ".run", "soak.csv"))
	// The customers are whitelisted (the pipeline's default group here):
	// 20,000 users at 2k msg/s send one message per 10 s each on average,
	// and bursts of the sync pages put some over the "normal" group's 5 per
	// 10 s, which blocks them for an hour and fills the DLQ index with
	// letters that say nothing about leaks. The bot alone is in "normal",
	// so the limiter, its blocks and the dead letters they make still run.
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2, Partitions: 12,
		SinkSleep: time.Millisecond, PageLimit: 1000})
	p.Sink.FailRatio(0.05)
	if err := operatorWrite(context.Background(), p, http.MethodPut, "/admin/ratelimit/group/"+p.BotName(),
		`{"group":"normal","reason":"soak: the bot is limited"}`); err != nil {
		t.Fatalf("putting the bot in group normal: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: svc.Redis})
	t.Cleanup(func() { _ = rdb.Close() })
	load := Load{Total: int(rate * dur.Seconds()), Users: 20000, Rate: rate, BotPerMin: 600}
	var samples []soakSample
	Run(t, "soak", p, load, 10*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		start := time.Now()
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for time.Since(start) < dur {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			s := sampleSoak(ctx, p, rdb, time.Since(start))
			samples = append(samples, s)
			if err := writeSoak(out, samples); err != nil {
				return err
			}
		}
		judgeSoak(samples, warm, rate, rec)
		return nil
	})
	t.Logf("soak samples in %s", out)
}

// sampleSoak reads every daemon's /metrics (summed over the consumers),
// Redis INFO and the Sink.
func sampleSoak(ctx context.Context, p *Pipeline, rdb *redis.Client, at time.Duration) soakSample {
	s := soakSample{at: at, values: map[string]float64{}}
	for _, d := range p.Daemons() {
		for col, series := range map[string]string{"rss_mib": "process_resident_memory_bytes",
			"heap_mib": "go_memstats_heap_inuse_bytes", "goroutines": "go_goroutines", "fds": "process_open_fds"} {
			v, err := d.Metric(ctx, series)
			if err != nil {
				continue
			}
			if strings.HasSuffix(col, "_mib") {
				v /= 1 << 20
			}
			s.values[d.Name+"."+col] = v
			s.values[col] += v
		}
	}
	for _, c := range p.Consumers {
		if v, err := c.MetricSum(ctx, "kfpipe_consumer_lag"); err == nil {
			s.values["lag"] += v
		}
	}
	if used, err := usedMemory(ctx, rdb); err == nil {
		s.values["redis_mib"] = float64(used) / (1 << 20)
	}
	if n, err := rdb.DBSize(ctx).Result(); err == nil {
		s.values["redis_keys"] = float64(n)
	}
	n, _ := p.Sink.Len()
	s.values["processed"] = float64(n)
	return s
}

// writeSoak rewrites the CSV with every sample so far.
func writeSoak(path string, samples []soakSample) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	// The totals, then each daemon's RSS and heap (to tell which grows).
	cols := append([]string(nil), soakSeries...)
	for k := range samples[len(samples)-1].values {
		if strings.HasSuffix(k, ".rss_mib") || strings.HasSuffix(k, ".heap_mib") {
			cols = append(cols, k)
		}
	}
	slices.Sort(cols[len(soakSeries):])
	_ = w.Write(append([]string{"seconds"}, cols...))
	for _, s := range samples {
		row := []string{strconv.FormatFloat(s.at.Seconds(), 'f', 0, 64)}
		for _, c := range cols {
			row = append(row, strconv.FormatFloat(s.values[c], 'f', 2, 64))
		}
		_ = w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envFloat(t *testing.T, k string, def float64) float64 {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s: %v", k, err)
	}
	return f
}
