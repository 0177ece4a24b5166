package offsets

import (
	"math/rand/v2"
	"sync"
	"testing"
)

func TestTracker(t *testing.T) {
	type step struct {
		add, done []int64
		want      int64 // -1 = not committable
		inFlight  int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"nothing done", []step{{add: []int64{0, 1, 2}, want: -1, inFlight: 3}}},
		{"in order", []step{
			{add: []int64{0, 1, 2}, done: []int64{0}, want: 1, inFlight: 2},
			{done: []int64{1, 2}, want: 3, inFlight: 0},
		}},
		{"later finishes first", []step{
			{add: []int64{10, 11, 12}, done: []int64{12, 11}, want: -1, inFlight: 3},
			{done: []int64{10}, want: 13, inFlight: 0},
		}},
		{"gap from a transaction marker", []step{
			{add: []int64{5, 7, 8}, done: []int64{7}, want: -1, inFlight: 3},
			{done: []int64{5}, want: 8, inFlight: 1},
			{done: []int64{8}, want: 9, inFlight: 0},
		}},
		{"done twice and unknown offsets ignored", []step{
			{add: []int64{1, 2}, done: []int64{1, 1, 99, 0}, want: 2, inFlight: 1},
		}},
		{"non-increasing add ignored", []step{
			{add: []int64{3, 2, 3}, done: []int64{3}, want: 4, inFlight: 0},
		}},
		{"grows past the initial ring", []step{
			{add: seq(0, 100), done: seq(1, 100), want: -1, inFlight: 100},
			{done: []int64{0}, want: 100, inFlight: 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(3)
			for i, s := range tt.steps {
				for _, o := range s.add {
					tr.Add(o)
				}
				for _, o := range s.done {
					tr.Done(o)
				}
				next, ok := tr.Committable()
				if tt := s.want; (tt < 0 && ok) || (tt >= 0 && (!ok || next != tt)) {
					t.Fatalf("step %d: Committable() = %d, %v; want %d", i, next, ok, tt)
				}
				if got := tr.InFlight(); got != s.inFlight {
					t.Fatalf("step %d: InFlight() = %d, want %d", i, got, s.inFlight)
				}
			}
		})
	}
}

func seq(from, to int64) []int64 {
	var s []int64
	for o := from; o < to; o++ {
		s = append(s, o)
	}
	return s
}

// TestTrackerProperty finishes offsets (with random gaps) in random order,
// interleaved with adds, and checks after every step that the committable
// offset never passes an unfinished offset and never goes down.
func TestTrackerProperty(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		tr := NewTracker(0)
		var added []int64
		finished := map[int64]bool{}
		var pending []int64
		next, prev := int64(r.IntN(5)), int64(-1)
		for step := 0; step < 500; step++ {
			if r.IntN(2) == 0 || len(pending) == 0 {
				tr.Add(next)
				added = append(added, next)
				pending = append(pending, next)
				next += 1 + int64(r.IntN(3)) // gaps
			} else {
				i := r.IntN(len(pending))
				o := pending[i]
				pending = append(pending[:i], pending[i+1:]...)
				tr.Done(o)
				finished[o] = true
			}
			c, ok := tr.Committable()
			if !ok {
				continue
			}
			if c < prev {
				t.Fatalf("seed %d: committable went down %d -> %d", seed, prev, c)
			}
			prev = c
			for _, o := range added {
				if o < c && !finished[o] {
					t.Fatalf("seed %d: committable %d passes unfinished %d", seed, c, o)
				}
			}
			// And it is the longest finished prefix, not a shorter one.
			want := int64(-1)
			for _, o := range added {
				if !finished[o] {
					break
				}
				want = o + 1
			}
			if want != c {
				t.Fatalf("seed %d: committable %d, longest finished prefix ends at %d", seed, c, want)
			}
		}
	}
}

func TestTrackerConcurrentDone(t *testing.T) {
	tr := NewTracker(0)
	const n = 10000
	for o := int64(0); o < n; o++ {
		tr.Add(o)
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := int64(w); o < n; o += 8 {
				tr.Done(o)
			}
		}()
	}
	wg.Wait()
	if c, ok := tr.Committable(); !ok || c != n || tr.InFlight() != 0 {
		t.Fatalf("Committable() = %d, %v, InFlight %d; want %d, true, 0", c, ok, tr.InFlight(), n)
	}
}

// BenchmarkTracker measures one Add plus one Done with a window of 1024
// in-flight offsets finished out of order.
func BenchmarkTracker(b *testing.B) {
	tr := NewTracker(0)
	const window = 1024
	for o := int64(0); o < window; o++ {
		tr.Add(o)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := int64(i)
		tr.Add(o + window)
		// Finish in a scrambled order inside the window.
		tr.Done(o ^ 7)
	}
}

func BenchmarkTrackerGaps(b *testing.B) {
	tr := NewTracker(0)
	const window = 1024
	for o := int64(0); o < window; o++ {
		tr.Add(2 * o)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := int64(i)
		tr.Add(2 * (o + window))
		tr.Done(2 * (o ^ 7))
	}
}
