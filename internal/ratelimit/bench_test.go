package ratelimit

import (
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAllow measures the in-memory hot path with 1k and 100k known
// users decided in parallel in random order. At 100k the states do not fit
// in cache, so it measures mostly memory latency (the first touch of a
// state); an actor deciding its user's messages back to back sees the 1k
// figure.
func BenchmarkAllow(b *testing.B) {
	for _, users := range []int{1_000, 100_000} {
		b.Run(strconv.Itoa(users)+"users", func(b *testing.B) { benchmarkAllow(b, users) })
	}
}

func benchmarkAllow(b *testing.B, users int) {
	l := newLimiter(b, seedConfig(), nil)
	names := make([]string, users)
	for i := range names {
		names[i] = "user-" + strconv.Itoa(i)
		l.Allow(bg, names[i], t0)
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := int(worker.Add(1))
		i := w * 7919
		now := t0
		for pb.Next() {
			i++
			if i%users == 0 {
				now = now.Add(3 * time.Second) // a user comes back every 3 s: mostly allowed
			}
			l.Allow(bg, names[(i*31+w)%users], now)
		}
	})
}

// BenchmarkBreakerAllow measures a closed breaker's Allow + done.
func BenchmarkBreakerAllow(b *testing.B) {
	bs, err := NewBreakers(seedBreaker())
	if err != nil {
		b.Fatal(err)
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		user := "user-" + strconv.FormatInt(worker.Add(1), 10)
		for pb.Next() {
			done, err := bs.Allow(user)
			if err == nil {
				done(true)
			}
		}
	})
}

// TestMemoryPerIdleUser measures the heap a known, idle user costs in the
// limiter and the breaker registry (goal: well under the 4 KiB per user of
// the whole consumer).
func TestMemoryPerIdleUser(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 100k users")
	}
	const users = 100_000
	names := make([]string, users)
	for i := range names {
		names[i] = "wmLJ8UDQAAxxxxxxxxxxxxxxxx" + strconv.Itoa(i) // the length of an external_userid
	}
	measure := func(fill func()) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		fill()
		runtime.GC()
		runtime.ReadMemStats(&after)
		return float64(after.HeapAlloc-before.HeapAlloc) / users
	}
	l := newLimiter(t, seedConfig(), nil)
	perLimiter := measure(func() {
		for i, u := range names {
			for j := range 3 { // a few messages: the ring is allocated
				l.Allow(bg, u, t0.Add(time.Duration(i+j)*time.Millisecond))
			}
		}
	})
	bs, err := NewBreakers(seedBreaker())
	if err != nil {
		t.Fatal(err)
	}
	perBreaker := measure(func() {
		for _, u := range names {
			done, _ := bs.Allow(u)
			done(true)
		}
	})
	t.Logf("per idle user: limiter %.0f B, breaker %.0f B", perLimiter, perBreaker)
	if perLimiter+perBreaker > 1024 {
		t.Errorf("limiter+breaker cost %.0f B per idle user, want <= 1 KiB (of the 4 KiB per-user budget)", perLimiter+perBreaker)
	}
	runtime.KeepAlive(l)
	runtime.KeepAlive(bs)
}
