package bench

import (
	"slices"
	"sync"
	"time"
)

// pageRecord is one ProduceBatch page of a producer scenario: which
// caller sent it, its index in that caller's sequence, when it started
// (since the producer was created) and how long it took.
type pageRecord struct {
	Stream int     `json:"stream"`
	Index  int     `json:"index"`
	AtMs   float64 `json:"at_ms"`
	Ms     float64 `json:"ms"`
}

// pageLog records every page of a run, to tell start-up waits (the first
// pages of each caller) from stalls spread over the run.
type pageLog struct {
	origin time.Time
	mu     sync.Mutex
	pages  []pageRecord
}

func newPageLog(origin time.Time) *pageLog { return &pageLog{origin: origin} }

func (l *pageLog) add(stream, index int, start time.Time, took time.Duration) {
	r := pageRecord{Stream: stream, Index: index, AtMs: round(float64(start.Sub(l.origin).Microseconds())/1000, 1),
		Ms: round(float64(took.Microseconds())/1000, 2)}
	l.mu.Lock()
	l.pages = append(l.pages, r)
	l.mu.Unlock()
}

// slowest returns the n slowest pages, slowest first.
func (l *pageLog) slowest(n int) []pageRecord {
	l.mu.Lock()
	s := slices.Clone(l.pages)
	l.mu.Unlock()
	slices.SortFunc(s, func(a, b pageRecord) int {
		switch {
		case a.Ms > b.Ms:
			return -1
		case a.Ms < b.Ms:
			return 1
		}
		return 0
	})
	return s[:min(n, len(s))]
}

// firsts returns each caller's first page.
func (l *pageLog) firsts() []pageRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pageRecord
	for _, p := range l.pages {
		if p.Index == 0 {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b pageRecord) int { return a.Stream - b.Stream })
	return out
}
