package idgen

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

func newTestSequencer(t *testing.T, cfg SequencerConfig) (*Sequencer, *redis.Client, string) {
	t.Helper()
	client, prefix := testenv.Redis(t)
	cfg.Prefix = prefix
	s, err := NewSequencer(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, client, prefix
}

func nexts(t *testing.T, s *Sequencer, key string, n int) []int64 {
	t.Helper()
	out := make([]int64, n)
	for i := range out {
		v, err := s.Next(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

func TestSequencerNext(t *testing.T) {
	s, client, prefix := newTestSequencer(t, SequencerConfig{Step: 5})
	if got := nexts(t, s, "conv:1", 3); !slices.Equal(got, []int64{5, 10, 15}) {
		t.Fatalf("Next ×3 = %v, want [5 10 15]", got)
	}
	if got := nexts(t, s, "conv:2", 1); got[0] != 5 {
		t.Fatalf("another key starts at %d, want 5 (keys are independent)", got[0])
	}
	if v, err := client.Get(context.Background(), prefix+"seq:conv:1").Int64(); err != nil || v != 15 {
		t.Fatalf("redis key %sseq:conv:1 = %d, %v; want 15", prefix, v, err)
	}
	if ttl := client.PTTL(context.Background(), prefix+"seq:conv:1").Val(); ttl != -1 {
		t.Fatalf("PTTL without a configured TTL = %s, want none (-1)", ttl)
	}
	if _, err := s.Next(context.Background(), ""); err == nil {
		t.Fatal("Next with an empty key succeeded")
	}
}

func TestSequencerConcurrentNextIsUnique(t *testing.T) {
	s, _, _ := newTestSequencer(t, SequencerConfig{})
	const workers, each = 10, 100
	got := make([][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				v, err := s.Next(context.Background(), "k")
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], v)
			}
		})
	}
	wg.Wait()
	all := slices.Sorted(slices.Values(slices.Concat(got...)))
	for i, v := range all {
		if v != int64(i+1) {
			t.Fatalf("values %v…, want exactly 1..%d", all[:min(len(all), 20)], workers*each)
		}
	}
}

func TestSequencerNextBatch(t *testing.T) {
	s, _, _ := newTestSequencer(t, SequencerConfig{Step: 5})
	ctx := context.Background()
	got, err := s.NextBatch(ctx, "b", 3)
	if err != nil || !slices.Equal(got, []int64{5, 10, 15}) {
		t.Fatalf("NextBatch(3) = %v, %v; want [5 10 15]", got, err)
	}
	if v := nexts(t, s, "b", 1)[0]; v != 20 {
		t.Fatalf("Next after the batch = %d, want 20", v)
	}
	for _, n := range []int{0, -1, MaxBatch + 1} {
		if _, err := s.NextBatch(ctx, "b", n); err == nil {
			t.Errorf("NextBatch(%d) succeeded", n)
		}
	}
}

func TestSequencerWrap(t *testing.T) {
	s, _, _ := newTestSequencer(t, SequencerConfig{Step: 1, MaxValue: 3})
	if got := nexts(t, s, "w", 7); !slices.Equal(got, []int64{1, 2, 3, 1, 2, 3, 1}) {
		t.Fatalf("Next ×7 with max 3 = %v, want [1 2 3 1 2 3 1]", got)
	}

	s10, _, _ := newTestSequencer(t, SequencerConfig{Step: 1, MaxValue: 10})
	ctx := context.Background()
	nexts(t, s10, "b", 8)
	got, err := s10.NextBatch(ctx, "b", 3) // 9..11 would pass 10: the batch restarts
	if err != nil || !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("NextBatch across max = %v, %v; want [1 2 3]", got, err)
	}
	if _, err := s10.NextBatch(ctx, "b", 11); err == nil || !strings.Contains(err.Error(), "idgen.sequencer.max_value") {
		t.Fatalf("NextBatch larger than max = %v, want an error naming idgen.sequencer.max_value", err)
	}
}

func TestSequencerTTLRefresh(t *testing.T) {
	s, client, prefix := newTestSequencer(t, SequencerConfig{TTL: 10 * time.Second})
	ctx := context.Background()
	key := prefix + "seq:t"
	nexts(t, s, "t", 1)
	if ttl := client.PTTL(ctx, key).Val(); ttl <= 9*time.Second || ttl > 10*time.Second {
		t.Fatalf("PTTL after Next = %s, want about 10s", ttl)
	}
	for _, op := range []struct {
		name string
		run  func() error
	}{
		{"Next", func() error { _, err := s.Next(ctx, "t"); return err }},
		{"NextBatch", func() error { _, err := s.NextBatch(ctx, "t", 4); return err }},
		{"Set", func() error { return s.Set(ctx, "t", 100) }},
	} {
		client.PExpire(ctx, key, time.Second)
		if err := op.run(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if ttl := client.PTTL(ctx, key).Val(); ttl <= 9*time.Second {
			t.Fatalf("PTTL after %s = %s, want it refreshed to about 10s", op.name, ttl)
		}
	}
}

func TestSequencerSet(t *testing.T) {
	s, client, prefix := newTestSequencer(t, SequencerConfig{Step: 2, MaxValue: 1000, TTL: time.Minute})
	ctx := context.Background()
	ok, err := s.SetIfNotExists(ctx, "m", 100)
	if err != nil || !ok {
		t.Fatalf("first SetIfNotExists = %v, %v; want true", ok, err)
	}
	if ttl := client.PTTL(ctx, prefix+"seq:m").Val(); ttl <= 0 {
		t.Fatalf("PTTL after SetIfNotExists = %s, want the configured TTL", ttl)
	}
	ok, err = s.SetIfNotExists(ctx, "m", 500)
	if err != nil || ok {
		t.Fatalf("second SetIfNotExists = %v, %v; want false", ok, err)
	}
	if v := nexts(t, s, "m", 1)[0]; v != 102 {
		t.Fatalf("Next after SetIfNotExists(100), refused (500) = %d, want 102", v)
	}
	if err := s.Set(ctx, "m", 7); err != nil {
		t.Fatal(err)
	}
	if v := nexts(t, s, "m", 1)[0]; v != 9 {
		t.Fatalf("Next after Set(7) = %d, want 9", v)
	}
	for _, v := range []int64{-1, 1001} {
		if err := s.Set(ctx, "m", v); err == nil {
			t.Errorf("Set(%d) outside [0, max_value] succeeded", v)
		}
	}
}

func TestSequencerConfig(t *testing.T) {
	client, _ := testenv.Redis(t)
	tests := []struct {
		name    string
		cfg     SequencerConfig
		wantErr string
	}{
		{"defaults", SequencerConfig{}, ""},
		{"redis", SequencerConfig{Driver: "redis", Step: 3, MaxValue: 3, TTL: time.Second}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSequencer(client, tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewSequencer error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}
