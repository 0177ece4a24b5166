package once

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// Issue #30, hole 5: after Redis lost its script cache (a restart, SCRIPT
// FLUSH), a pipelined script with two keys is sent again whole with its
// own key count — not as a one-key script, which shifted the second key
// into ARGV and made the leases store refuse a fenced mark that was its
// own.
func TestNoScriptFallbackKeepsTheKeyCount(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.PrivateRedis(t, "--dir", t.TempDir())})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := redis.NewScript(`return {#KEYS, KEYS[1], KEYS[2], ARGV[1]}`)
	if err := s.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	b := newBatcher(rdb, BatchConfig{MaxBatch: 8, Pipelines: 1}, 5*time.Second, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}))
	defer b.close()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := b.do(ctx, s, []any{"evalsha", s.Hash(), 2, "k1", "k2", "a1"})
	if err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
	if got := fmt.Sprint(res); got != "[2 k1 k2 a1]" {
		t.Fatalf("the script saw %s, want [2 k1 k2 a1] (two keys, one argument)", got)
	}
}
