package overload

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fakeNow is a settable clock.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time { return f.t }

// receiver is a simulated downstream with capacity concurrent workers and
// a FIFO queue in front of them (what a web server with a worker pool
// does): beyond capacity, calls wait and their latency grows.
type receiver struct {
	capacity int
	service  func() time.Duration
	busy     []time.Time // end times of the calls being served
	queue    []call
	open     int       // calls at the receiver (served + queued)
	running  []pending // calls in flight at the client (acquired), kept between simulate calls
	idle     int
	started  bool
	peak     int
	served   int
}

type pending struct {
	start, done time.Time
}

type call struct {
	start time.Time
}

// simulate offers the limiter more calls than the receiver can carry
// (clients callers, each calling again as soon as it may) for d, stepping
// 10 ms, and returns the receiver and the limit sampled each second.
func simulate(t *testing.T, l *Limiter, clk *fakeNow, r *receiver, clients int, d time.Duration,
	onSecond func(sec int, r *receiver)) {
	t.Helper()
	if !r.started {
		r.started, r.idle = true, clients
	}
	running, idle := r.running, r.idle
	defer func() { r.running, r.idle = running, idle }()
	step := 10 * time.Millisecond
	end := clk.t.Add(d)
	nextSec, sec := clk.t.Add(time.Second), 0
	for clk.t.Before(end) {
		// Admit new calls.
		for idle > 0 {
			start, ok := l.TryAcquire()
			if !ok {
				break
			}
			idle--
			r.open++
			r.peak = max(r.peak, r.open)
			if len(r.busy) < r.capacity {
				e := clk.t.Add(r.service())
				r.busy = append(r.busy, e)
				running = append(running, pending{start: start, done: e})
			} else {
				r.queue = append(r.queue, call{start: start})
				running = append(running, pending{start: start})
			}
		}
		clk.t = clk.t.Add(step)
		// Finish served calls, start queued ones.
		keep := r.busy[:0]
		freed := 0
		for _, e := range r.busy {
			if e.After(clk.t) {
				keep = append(keep, e)
			} else {
				freed++
			}
		}
		r.busy = keep
		for ; freed > 0 && len(r.queue) > 0; freed-- {
			q := r.queue[0]
			r.queue = r.queue[1:]
			e := clk.t.Add(r.service())
			r.busy = append(r.busy, e)
			for i := range running {
				if running[i].start.Equal(q.start) && running[i].done.IsZero() {
					running[i].done = e
					break
				}
			}
		}
		rest := running[:0]
		for _, p := range running {
			if !p.done.IsZero() && !p.done.After(clk.t) {
				r.open--
				r.served++
				idle++
				l.Release(p.start, Success)
				continue
			}
			rest = append(rest, p)
		}
		running = rest
		if !clk.t.Before(nextSec) {
			sec++
			nextSec = nextSec.Add(time.Second)
			if onSecond != nil {
				onSecond(sec, r)
			}
		}
	}
}

// TestLimiterFindsTheReceiversCapacity: offered 5× what a receiver with
// capacity 32 and 1–3 s answers can carry, the limit settles near 32: the
// receiver is kept busy (≥ 85% of its capacity) without a queue much
// longer than its capacity.
func TestLimiterFindsTheReceiversCapacity(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	rng := rand.New(rand.NewPCG(1, 2))
	const capacity = 32
	r := &receiver{capacity: capacity, service: func() time.Duration {
		return time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	}}
	l := New(Config{Initial: 10, Min: 1, Max: 256}, clk.now)
	var servedAt60, peakAfterWarmup, open int
	simulate(t, l, clk, r, 5*capacity, 300*time.Second, func(sec int, r *receiver) {
		switch {
		case sec == 60:
			servedAt60 = r.served
		case sec > 60:
			peakAfterWarmup = max(peakAfterWarmup, r.open)
		}
		open += r.open
	})
	share := float64(r.served-servedAt60) / (240 * capacity / 2.0) // capacity / mean service = 16/s
	t.Logf("limit=%d peak_open=%d (after warm-up %d) share=%.2f", l.Stats().Limit, r.peak, peakAfterWarmup, share)
	if share < 0.85 {
		t.Errorf("throughput %.2f of the receiver's capacity, want >= 0.85", share)
	}
	if peakAfterWarmup > capacity*3/2 {
		t.Errorf("peak concurrency at the receiver %d, want <= %d", peakAfterWarmup, capacity*3/2)
	}
}

// TestLimiterWithoutAdaptingFloodsTheReceiver is the control: a fixed
// limit of 5× capacity puts every client at the receiver at once.
func TestLimiterWithoutAdaptingFloodsTheReceiver(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	const capacity = 32
	r := &receiver{capacity: capacity, service: func() time.Duration { return 2 * time.Second }}
	l := New(Config{Initial: 5 * capacity, Min: 5 * capacity, Max: 5 * capacity}, clk.now)
	simulate(t, l, clk, r, 5*capacity, 30*time.Second, nil)
	if r.peak != 5*capacity {
		t.Fatalf("peak %d, want %d", r.peak, 5*capacity)
	}
}

// TestLimiterFollowsASlowdown: a receiver whose answers go from 100 ms to
// 3 s and back — its capacity in concurrent calls unchanged — gets a
// limit that falls when the latency jumps and grows back to about its
// capacity.
func TestLimiterFollowsASlowdown(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	const capacity = 20
	// Answers spread ±50% around the latency, as real ones do: with a
	// constant service time calls arrive in convoys whose first ones are
	// never queued, and the shortest call says nothing (a limit of the
	// shortest-call signal; docs/architecture.md, "Overload").
	rng := rand.New(rand.NewPCG(3, 4))
	lat := 100 * time.Millisecond
	r := &receiver{capacity: capacity, service: func() time.Duration {
		return lat/2 + time.Duration(rng.Int64N(int64(lat)))
	}}
	l := New(Config{Initial: 10, Min: 1, Max: 256}, clk.now)
	limits := map[string][]int{}
	phase := "fast"
	rec := func(sec int, r *receiver) { limits[phase] = append(limits[phase], l.Stats().Limit) }
	simulate(t, l, clk, r, 100, 60*time.Second, rec)
	phase, lat = "slow", 3*time.Second
	simulate(t, l, clk, r, 100, 120*time.Second, rec)
	phase, lat = "fast again", 100*time.Millisecond
	simulate(t, l, clk, r, 100, 60*time.Second, rec)
	t.Logf("limit per second: %v", limits)
	minSlow := 1 << 30
	for _, v := range limits["slow"][:20] {
		minSlow = min(minSlow, v)
	}
	lastFast := limits["fast"][len(limits["fast"])-1]
	if minSlow >= lastFast {
		t.Errorf("the limit did not fall when the receiver slowed: min %d in the slow phase's first 20 s, %d before", minSlow, lastFast)
	}
	for ph, v := range limits {
		last := v[len(v)-1]
		// A 100 ms receiver is probed harder (a window closes every few
		// tens of milliseconds): its limit saws between 1.5 and 2.5 times
		// the capacity, where the queue is 50 ms of waiting.
		if last < capacity*3/4 || last > capacity*5/2 {
			t.Errorf("%s: limit %d at the end, want about the capacity %d", ph, last, capacity)
		}
	}
}

func TestLimiterCutsOnATimeout(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	l := New(Config{Initial: 40, Min: 1, Max: 100}, clk.now)
	var starts []time.Time
	for range 10 {
		s, ok := l.TryAcquire()
		if !ok {
			t.Fatal("no slot below the limit")
		}
		starts = append(starts, s)
	}
	clk.t = clk.t.Add(time.Second)
	l.Release(starts[0], Dropped)
	if got := l.Stats().Limit; got != 30 {
		t.Fatalf("limit %d after a timeout, want 30", got)
	}
	// The other calls of that time say nothing new: no second cut.
	for _, s := range starts[1:] {
		l.Release(s, Dropped)
	}
	if got := l.Stats().Limit; got != 30 {
		t.Fatalf("limit %d after the same moment's timeouts, want 30", got)
	}
	if st := l.Stats(); st.InFlight != 0 || st.Decreases != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLimiterWaitersInOrderAndCancelled(t *testing.T) {
	l := New(Config{Initial: 1, Min: 1, Max: 1}, nil)
	s, _ := l.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan bool)
	go func() { _, ok := l.Acquire(ctx); gone <- ok }()
	for l.Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	got := make(chan time.Time)
	go func() { s, _ := l.Acquire(context.Background()); got <- s }()
	for l.Stats().Waiting != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if <-gone {
		t.Fatal("a cancelled wait got a slot")
	}
	l.Release(s, Ignored)
	s2 := <-got
	if st := l.Stats(); st.InFlight != 1 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
	l.Release(s2, Ignored)
	if _, ok := l.TryAcquire(); !ok {
		t.Fatal("slot not given back")
	}
}

func TestNilLimiterAdmitsAll(t *testing.T) {
	var l *Limiter
	if _, ok := l.Acquire(context.Background()); !ok {
		t.Fatal("nil limiter refused")
	}
	l.Release(time.Time{}, Success)
}

func TestBudgetBoundsRetries(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	b := NewBudget(0.2, 1, 5, clk.now)
	retries := 0
	for range 1000 {
		b.Call()
		for b.Retry() { // a storm: every call wants to be retried at once
			retries++
		}
	}
	// 5 saved + 0.2 per call.
	if retries > 5+200 || retries < 195 {
		t.Fatalf("%d retries for 1000 calls, want about 200", retries)
	}
	// No first calls: the floor lets one a second through.
	got := 0
	for range 10 {
		clk.t = clk.t.Add(time.Second)
		for b.Retry() {
			got++
		}
	}
	if got != 10 {
		t.Fatalf("%d retries in 10 s of floor, want 10", got)
	}
	if b.Denied() == 0 {
		t.Fatal("no retry refused")
	}
	var nb *Budget
	if !nb.Retry() {
		t.Fatal("nil budget refused")
	}
}

func BenchmarkLimiterUncontended(b *testing.B) {
	l := New(DefaultConfig(1000), nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, _ := l.Acquire(ctx)
		l.Release(s, Success)
	}
}

// TestLimiterIgnoresSchedulerNoise: a handler that answers in
// microseconds, its latency jumping tenfold as a busy machine schedules
// its goroutines late, is never a queue: the limit only grows. Without
// the noise floor every window was slow on the ratio alone and the limit
// fell to 1.
func TestLimiterIgnoresSchedulerNoise(t *testing.T) {
	clk := &fakeNow{t: time.Unix(0, 0)}
	rng := rand.New(rand.NewPCG(5, 6))
	l := New(DefaultConfig(1024), clk.now)
	for i := range 20000 {
		start, ok := l.TryAcquire()
		if !ok {
			t.Fatalf("call %d: no slot with one call at a time (limit %d)", i, l.Stats().Limit)
		}
		lat := 2 * time.Microsecond
		if i > 1000 {
			lat += time.Duration(rng.Int64N(int64(500 * time.Microsecond)))
		}
		clk.t = clk.t.Add(lat)
		l.Release(start, Success)
	}
	if st := l.Stats(); st.Decreases != 0 || st.Limit < 10 {
		t.Fatalf("limit %d after %d cuts on scheduler noise", st.Limit, st.Decreases)
	}
}

// TestRetriesWaitBeforeFirstCalls: with every slot taken, a retry waits
// before the first calls already waiting (after the retries before it),
// and a cancelled retry leaves the order of the others as it was.
func TestRetriesWaitBeforeFirstCalls(t *testing.T) {
	l := New(Config{Initial: 1, Min: 1, Max: 1}, nil)
	s, _ := l.Acquire(context.Background())
	order := make(chan string, 8)
	wait := func(name string, retry bool, ctx context.Context) {
		n := l.Stats().Waiting
		go func() {
			var st time.Time
			var ok bool
			if retry {
				st, ok = l.AcquireRetry(ctx)
			} else {
				st, ok = l.Acquire(ctx)
			}
			if !ok {
				order <- name + "(cancelled)"
				return
			}
			order <- name
			l.Release(st, Ignored)
		}()
		for l.Stats().Waiting != n+1 {
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	wait("first-a", false, context.Background())
	wait("first-b", false, context.Background())
	wait("retry-1", true, context.Background())
	wait("retry-gone", true, ctx)
	wait("retry-2", true, context.Background())
	cancel()
	if got := <-order; got != "retry-gone(cancelled)" {
		t.Fatalf("first out %q, want the cancelled retry", got)
	}
	l.Release(s, Ignored)
	var got []string
	for range 4 {
		got = append(got, <-order)
	}
	want := []string{"retry-1", "retry-2", "first-a", "first-b"}
	if !slices.Equal(got, want) {
		t.Fatalf("slots went to %v, want %v", got, want)
	}
}
