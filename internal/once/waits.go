package once

import (
	"sync"
	"time"
)

// waitSet tracks the calls waiting on someone else's claim, so that a
// process stuck behind claims it cannot finish — a crashed owner's, until
// their lease expires — says so (Waiting, the keeper's log line, the
// kfpipe_once_waiting gauges) instead of stalling silently.
type waitSet struct {
	mu sync.Mutex
	m  map[*waiter]struct{}
}

// waiter is one waiting call.
type waiter struct {
	key   string
	since time.Time
}

func (s *waitSet) add(key string, since time.Time) *waiter {
	w := &waiter{key: key, since: since}
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[*waiter]struct{})
	}
	s.m[w] = struct{}{}
	s.mu.Unlock()
	return w
}

// remove forgets w; a nil w is ignored.
func (s *waitSet) remove(w *waiter) {
	if w == nil {
		return
	}
	s.mu.Lock()
	delete(s.m, w)
	s.mu.Unlock()
}

// Waits describes the calls that are waiting on claims held by others.
type Waits struct {
	// Count is how many calls are waiting.
	Count int
	// Oldest is how long the longest-waiting call has waited (0 when none).
	Oldest time.Duration
	// OldestKey is that call's key.
	OldestKey string
}

func (s *waitSet) snapshot(now time.Time) Waits {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := Waits{Count: len(s.m)}
	for x := range s.m {
		if d := now.Sub(x.since); d > w.Oldest {
			w.Oldest, w.OldestKey = d, x.key
		}
	}
	return w
}

// Waiting reports the calls currently waiting on claims held by others
// (for readiness detail and logs).
func (c *Client) Waiting() Waits { return c.waits.snapshot(time.Now()) }
