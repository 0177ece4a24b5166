package once

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkDo measures Do with a fresh key per call (claim + finish: two
// Redis operations), serially and from 32 goroutines per CPU, with and
// without batching.
//
//	go test -run '^$' -bench BenchmarkDo -benchtime 3s ./internal/once
func BenchmarkDo(b *testing.B) {
	for _, bc := range []struct {
		name        string
		batch       bool
		parallel    bool
		pipelines   int
		flush       time.Duration
		resp2       bool
		scriptClaim bool
	}{
		{"serial", false, false, 0, 0, false, false},
		{"serial/batch", true, false, 0, 0, false, false},
		{"parallel32", false, true, 0, 0, false, false},
		{"parallel32/batch", true, true, 0, 0, false, false},
		{"parallel32/batch/pipelines=1", true, true, 1, 0, false, false},
		{"parallel32/batch/pipelines=8", true, true, 8, 0, false, false},
		{"parallel32/batch/flush=1ms", true, true, 0, time.Millisecond, false, false},
		{"parallel32/batch/resp2", true, true, 0, 0, true, false},
		{"parallel32/batch/script_claim", true, true, 0, 0, false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			fx := newFixture(b, mode{batch: bc.batch, scriptClaim: bc.scriptClaim}, func(c *Config) {
				c.Batch.Pipelines = bc.pipelines
				c.Batch.FlushInterval = bc.flush
				if bc.resp2 {
					// The same server over RESP2 (go-redis defaults to RESP3).
					opts := *c.Client.(*redis.Client).Options()
					opts.Protocol = 2
					rdb := redis.NewClient(&opts)
					b.Cleanup(func() { _ = rdb.Close() })
					c.Client = rdb
				}
			})
			ctx := context.Background()
			f := func(context.Context) error { return nil }
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			if !bc.parallel {
				for i := 0; b.Loop(); i++ {
					if err := fx.c.Do(ctx, strconv.Itoa(i), 10*time.Second, f); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism(32)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						k := strconv.FormatUint(seq.Add(1), 10)
						if err := fx.c.Do(ctx, k, 10*time.Second, f); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		})
	}
}
