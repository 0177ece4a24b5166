package idgen

import (
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

var testEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// t0 is on a millisecond boundary, 1000 days after the epoch.
var t0 = testEpoch.Add(1000 * 24 * time.Hour)

func newTestGen(t *testing.T, clk Clock, opts ...Option) *Generator {
	t.Helper()
	g, err := New(SnowflakeConfig{Epoch: testEpoch, DatacenterID: 3, WorkerID: 7}, append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return g
}

func mustNext(t *testing.T, g *Generator) Parts {
	t.Helper()
	id, err := g.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	p := g.Decompose(id)
	if p.DatacenterID != 3 || p.WorkerID != 7 {
		t.Fatalf("node bits of %d = %d/%d, want 3/7", id, p.DatacenterID, p.WorkerID)
	}
	return p
}

// TestNewChecksTheLayout: the generator refuses an epoch out of its 41
// bits and a node its layout has no bits for (the idgen section's keys are
// internal/config's to check; the worker ID is the allocator's).
func TestNewChecksTheLayout(t *testing.T) {
	tests := []struct {
		name    string
		cfg     SnowflakeConfig
		wantErr string
	}{
		{"10-bit worker max", SnowflakeConfig{Epoch: testEpoch, WorkerID: 1023}, ""},
		{"5+5 max", SnowflakeConfig{Epoch: testEpoch, DatacenterID: 31, WorkerID: 31}, ""},
		{"no epoch", SnowflakeConfig{WorkerID: 1}, "idgen.epoch"},
		{"10-bit worker too big", SnowflakeConfig{Epoch: testEpoch, WorkerID: 1024}, "worker in [0, 1023], got 0/1024"},
		{"5+5 worker too big", SnowflakeConfig{Epoch: testEpoch, DatacenterID: 1, WorkerID: 32}, "datacenter and worker in [0, 31], got 1/32"},
		{"datacenter too big", SnowflakeConfig{Epoch: testEpoch, DatacenterID: 32}, "datacenter and worker in [0, 31], got 32/0"},
		{"negative worker", SnowflakeConfig{Epoch: testEpoch, WorkerID: -1}, "worker in [0, 1023], got 0/-1"},
		{"negative datacenter", SnowflakeConfig{Epoch: testEpoch, DatacenterID: -1}, "worker in [0, 1023], got -1/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, WithClock(newFakeClock(t0)))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewRejectsEpochOutOfRange(t *testing.T) {
	for name, epoch := range map[string]time.Time{
		"future":  t0.Add(time.Hour),
		"too old": t0.Add(-time.Duration(maxMillis+1) * time.Millisecond),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(SnowflakeConfig{Epoch: epoch}, WithClock(newFakeClock(t0)))
			if !errors.Is(err, ErrClockOutOfRange) {
				t.Fatalf("New error = %v, want ErrClockOutOfRange", err)
			}
		})
	}
}

func TestLayouts(t *testing.T) {
	clk := newFakeClock(t0)
	tests := []struct {
		dc, worker int
		wantNode   int64
	}{
		{0, 1023, 1023},
		{0, 5, 5},
		{31, 31, 31<<5 | 31},
		{1, 0, 1 << 5},
	}
	for _, tt := range tests {
		g, err := New(SnowflakeConfig{Epoch: testEpoch, DatacenterID: tt.dc, WorkerID: tt.worker}, WithClock(clk))
		if err != nil {
			t.Fatalf("New(%d/%d): %v", tt.dc, tt.worker, err)
		}
		id, err := g.Next()
		if err != nil {
			t.Fatal(err)
		}
		if node := id >> nodeShift & maxWorker10; node != tt.wantNode {
			t.Errorf("dc %d worker %d: node bits %d, want %d", tt.dc, tt.worker, node, tt.wantNode)
		}
		if ms := id >> timeShift; ms != t0.Sub(testEpoch).Milliseconds() {
			t.Errorf("time bits %d, want %d", ms, t0.Sub(testEpoch).Milliseconds())
		}
		p := g.Decompose(id)
		if p.DatacenterID != tt.dc || p.WorkerID != tt.worker || !p.Time.Equal(t0) || p.Sequence != 0 {
			t.Errorf("Decompose = %+v, want dc %d worker %d time %s seq 0", p, tt.dc, tt.worker, t0)
		}
	}
}

func TestSequenceWithinMillisecond(t *testing.T) {
	clk := newFakeClock(t0)
	g := newTestGen(t, clk)
	for want := range 10 {
		if p := mustNext(t, g); p.Sequence != want || !p.Time.Equal(t0) {
			t.Fatalf("id %d: %+v, want sequence %d at %s", want, p, want, t0)
		}
	}
	clk.Advance(time.Millisecond)
	if p := mustNext(t, g); p.Sequence != 0 || !p.Time.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("next millisecond: %+v, want sequence 0", p)
	}
}

func TestSequenceExhaustionWaitsForNextMillisecond(t *testing.T) {
	// 300µs into the millisecond: the wait must be exactly the 700µs left.
	clk := newFakeClock(t0.Add(300 * time.Microsecond))
	reg := prometheus.NewRegistry()
	g := newTestGen(t, clk, WithRegisterer(reg))
	for i := range maxSequence + 1 {
		if p := mustNext(t, g); p.Sequence != i || !p.Time.Equal(t0) {
			t.Fatalf("id %d: %+v", i, p)
		}
	}
	if d := clk.Slept(); d != 0 {
		t.Fatalf("slept %s before the sequence ran out", d)
	}
	p := mustNext(t, g)
	if !p.Time.Equal(t0.Add(time.Millisecond)) || p.Sequence != 0 {
		t.Fatalf("after exhaustion: %+v, want sequence 0 at t0+1ms", p)
	}
	if d := clk.Slept(); d != 700*time.Microsecond {
		t.Fatalf("slept %s, want 700µs", d)
	}
	if v := testenv.MetricValue(g.m.waits.WithLabelValues(reasonSequenceExhausted)); v != 1 {
		t.Fatalf("sequence_exhausted waits = %v, want 1", v)
	}
}

func TestClockRollbackTiers(t *testing.T) {
	tests := []struct {
		name      string
		back      time.Duration
		wantSleep time.Duration
		wantErr   error
	}{
		{"1ms reuses last time", time.Millisecond, 0, nil},
		{"5ms reuses last time", 5 * time.Millisecond, 0, nil},
		{"6ms waits", 6 * time.Millisecond, 6 * time.Millisecond, nil},
		{"300ms waits", 300 * time.Millisecond, 300 * time.Millisecond, nil},
		{"1s waits", time.Second, time.Second, nil},
		{"1.001s fails", time.Second + time.Millisecond, 0, ErrClockBackwards},
		{"1h fails", time.Hour, 0, ErrClockBackwards},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock(t0)
			reg := prometheus.NewRegistry()
			g := newTestGen(t, clk, WithRegisterer(reg))
			first := mustNext(t, g)
			clk.Set(t0.Add(-tt.back))
			id, err := g.Next()
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Next error = %v, want %v", err, tt.wantErr)
				}
				if v := testenv.MetricValue(g.m.errors.WithLabelValues(reasonClockBackwards)); v != 1 {
					t.Fatalf("kfpipe_idgen_errors_total{reason=clock_backwards} = %v, want 1", v)
				}
				if s, err := g.NextString(); err == nil || s != "" {
					t.Fatalf("NextString = %q, %v; want an error", s, err)
				}
				// Once the clock is back, IDs flow again.
				clk.Set(t0.Add(time.Millisecond))
				if p := mustNext(t, g); !p.Time.Equal(t0.Add(time.Millisecond)) {
					t.Fatalf("after recovery: %+v", p)
				}
				return
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			// Either tier issues the next sequence number at the last time.
			p := g.Decompose(id)
			if !p.Time.Equal(first.Time) || p.Sequence != first.Sequence+1 {
				t.Fatalf("after rollback: %+v, want sequence %d at %s", p, first.Sequence+1, first.Time)
			}
			if d := clk.Slept(); d != tt.wantSleep {
				t.Fatalf("slept %s, want %s", d, tt.wantSleep)
			}
		})
	}
}

func TestSmallRollbackWithExhaustedSequenceWaits(t *testing.T) {
	clk := newFakeClock(t0)
	g := newTestGen(t, clk)
	for range maxSequence + 1 {
		mustNext(t, g)
	}
	clk.Set(t0.Add(-3 * time.Millisecond))
	p := mustNext(t, g)
	if !p.Time.Equal(t0.Add(time.Millisecond)) || p.Sequence != 0 {
		t.Fatalf("got %+v, want sequence 0 at t0+1ms", p)
	}
	if d := clk.Slept(); d != 4*time.Millisecond {
		t.Fatalf("slept %s, want 4ms (3ms back + the rest of the last millisecond)", d)
	}
}

func TestClockPastLayoutFails(t *testing.T) {
	clk := newFakeClock(t0)
	reg := prometheus.NewRegistry()
	g := newTestGen(t, clk, WithRegisterer(reg))
	clk.Set(testEpoch.Add(time.Duration(maxMillis+1) * time.Millisecond))
	if _, err := g.Next(); !errors.Is(err, ErrClockOutOfRange) {
		t.Fatalf("Next error = %v, want ErrClockOutOfRange", err)
	}
	if v := testenv.MetricValue(g.m.errors.WithLabelValues(reasonClockOutOfRange)); v != 1 {
		t.Fatalf("clock_out_of_range errors = %v, want 1", v)
	}
}

func TestMetricsShareRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := newTestGen(t, newFakeClock(t0), WithRegisterer(reg))
	b := newTestGen(t, newFakeClock(t0), WithRegisterer(reg))
	if a.m.errors != b.m.errors {
		t.Fatal("second generator on one registry did not reuse the registered counter")
	}
}

func TestNextString(t *testing.T) {
	g := newTestGen(t, newFakeClock(t0))
	s, err := g.NextString()
	if err != nil {
		t.Fatal(err)
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || !g.Decompose(id).Time.Equal(t0) {
		t.Fatalf("NextString = %q (%d, %v)", s, id, err)
	}
}

func TestComposeDecomposeRoundTrip(t *testing.T) {
	tests := []struct {
		layout Layout
		parts  Parts
	}{
		{Layout{Epoch: testEpoch}, Parts{Time: t0, WorkerID: 1023, Sequence: 4095}},
		{Layout{Epoch: testEpoch}, Parts{Time: testEpoch}},
		{Layout{Epoch: testEpoch, SplitNode: true}, Parts{Time: t0.Add(7 * time.Millisecond), DatacenterID: 31, WorkerID: 1, Sequence: 9}},
		{Layout{Epoch: testEpoch, SplitNode: true}, Parts{Time: testEpoch.Add(time.Duration(maxMillis) * time.Millisecond), DatacenterID: 1, WorkerID: 31}},
	}
	for _, tt := range tests {
		id, err := tt.layout.Compose(tt.parts)
		if err != nil {
			t.Fatalf("Compose(%+v): %v", tt.parts, err)
		}
		if id < 0 {
			t.Fatalf("Compose(%+v) = %d, negative", tt.parts, id)
		}
		got := tt.layout.Decompose(id)
		if !got.Time.Equal(tt.parts.Time) || got.DatacenterID != tt.parts.DatacenterID ||
			got.WorkerID != tt.parts.WorkerID || got.Sequence != tt.parts.Sequence {
			t.Fatalf("Decompose(Compose(%+v)) = %+v", tt.parts, got)
		}
	}
}

func TestComposeRejects(t *testing.T) {
	ten := Layout{Epoch: testEpoch}
	split := Layout{Epoch: testEpoch, SplitNode: true}
	tests := []struct {
		name   string
		layout Layout
		parts  Parts
	}{
		{"before epoch", ten, Parts{Time: testEpoch.Add(-time.Millisecond)}},
		{"past 41 bits", ten, Parts{Time: testEpoch.Add(time.Duration(maxMillis+1) * time.Millisecond)}},
		{"sequence", ten, Parts{Time: t0, Sequence: 4096}},
		{"worker 1024", ten, Parts{Time: t0, WorkerID: 1024}},
		{"datacenter in 10-bit layout", ten, Parts{Time: t0, DatacenterID: 1}},
		{"worker 32 in 5+5", split, Parts{Time: t0, DatacenterID: 1, WorkerID: 32}},
		{"datacenter 32", split, Parts{Time: t0, DatacenterID: 32}},
	}
	for _, tt := range tests {
		if id, err := tt.layout.Compose(tt.parts); err == nil {
			t.Errorf("%s: Compose = %d, want an error", tt.name, id)
		}
	}
}

func FuzzDecompose(f *testing.F) {
	for _, id := range []int64{0, 1, 4095, 4096, 1 << 22, 1<<63 - 1, -1, -1 << 63, 1234567890123456789} {
		f.Add(id, false)
		f.Add(id, true)
	}
	f.Fuzz(func(t *testing.T, id int64, split bool) {
		l := Layout{Epoch: testEpoch, SplitNode: split}
		p := l.Decompose(id)
		if p.Sequence < 0 || p.Sequence > maxSequence || p.WorkerID < 0 || p.DatacenterID < 0 {
			t.Fatalf("Decompose(%d) = %+v: field out of range", id, p)
		}
		if split && (p.WorkerID > maxHalfNode || p.DatacenterID > maxHalfNode) {
			t.Fatalf("Decompose(%d) in 5+5 = %+v", id, p)
		}
		if !split && (p.WorkerID > maxWorker10 || p.DatacenterID != 0) {
			t.Fatalf("Decompose(%d) in 10-bit = %+v", id, p)
		}
		back, err := l.Compose(p)
		if err != nil {
			t.Fatalf("Compose(Decompose(%d) = %+v): %v", id, p, err)
		}
		// The sign bit is not part of the layout.
		if want := id & (1<<63 - 1); back != want {
			t.Fatalf("Compose(Decompose(%d)) = %d, want %d", id, back, want)
		}
	})
}

// TestNoDuplicatesConcurrent is the uniqueness property on the real clock:
// 8 goroutines share one generator; every ID must be distinct and each
// goroutine's IDs strictly increasing.
//
// 10 million IDs take at least 2.44 s (4,096 per millisecond is the layout's
// ceiling), about 8 s under -race; -short runs 200,000. Because each
// goroutine's run is checked to be increasing, the 8 runs are merged rather
// than sorted, which keeps the check linear (sorting 10M under -race took
// 15 s) and needs no memory beyond the IDs themselves.
func TestNoDuplicatesConcurrent(t *testing.T) {
	total := 10_000_000
	if testing.Short() {
		total = 200_000
	}
	const workers = 8
	g, err := New(SnowflakeConfig{Epoch: testEpoch, WorkerID: 513})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, total) // 80 MB at 10M; sorted in place below
	per := total / workers
	var wg sync.WaitGroup
	errs := make([]error, workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			part := ids[w*per : (w+1)*per]
			prev := int64(-1)
			for i := range part {
				id, err := g.Next()
				if err != nil {
					errs[w] = err
					return
				}
				if id <= prev {
					errs[w] = errors.New("ids of one goroutine not increasing: " +
						strconv.FormatInt(prev, 10) + " then " + strconv.FormatInt(id, 10))
					return
				}
				prev = id
				part[i] = id
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d IDs from %d goroutines in %s (%.0f IDs/ms, GOMAXPROCS %d)",
		total, workers, elapsed, float64(total)/float64(elapsed.Milliseconds()), runtime.GOMAXPROCS(0))
	// k-way merge of the increasing runs: a duplicate shows up as two equal
	// consecutive values of the merged order.
	var heads [workers]int
	prev, seen := int64(-1), 0
	for {
		best := -1
		for w := range workers {
			if heads[w] < per && (best < 0 || ids[w*per+heads[w]] < ids[best*per+heads[best]]) {
				best = w
			}
		}
		if best < 0 {
			break
		}
		id := ids[best*per+heads[best]]
		heads[best]++
		if id == prev {
			t.Fatalf("duplicate id %d (%+v)", id, g.Decompose(id))
		}
		prev = id
		seen++
	}
	if seen != per*workers {
		t.Fatalf("merged %d ids, want %d", seen, per*workers)
	}
	if p := g.Decompose(ids[0]); p.WorkerID != 513 {
		t.Fatalf("worker bits %d, want 513", p.WorkerID)
	}
}

func TestFromConfig(t *testing.T) {
	c := config.IDGen{Epoch: "2024-01-01T00:00:00Z", DatacenterID: 2,
		Allocator: config.Allocator{Backend: "redis", MaxID: 32, TTL: 30 * time.Second},
		Sequencer: config.Sequencer{Driver: "redis", Step: 2, MaxValue: 100, TTL: time.Hour}}
	sc := SnowflakeFromConfig(c, 9)
	if !sc.Epoch.Equal(testEpoch) || sc.DatacenterID != 2 || sc.WorkerID != 9 {
		t.Fatalf("SnowflakeFromConfig = %+v", sc)
	}
	if _, err := New(sc); err != nil {
		t.Fatalf("New(SnowflakeFromConfig): %v", err)
	}
	ac := AllocatorFromConfig(c, "kfpipe:", "me")
	if ac != (AllocatorConfig{Prefix: "kfpipe:", MaxID: 32, TTL: 30 * time.Second, Owner: "me"}) {
		t.Fatalf("AllocatorFromConfig = %+v", ac)
	}
	qc := SequencerFromConfig(c, "kfpipe:")
	if qc != (SequencerConfig{Driver: "redis", Prefix: "kfpipe:", Step: 2, MaxValue: 100, TTL: time.Hour}) {
		t.Fatalf("SequencerFromConfig = %+v", qc)
	}
}
