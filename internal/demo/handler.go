package demo

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// errOutage is what the business handler answers while the scripted
// downstream outage lasts.
var errOutage = errors.New("downstream unavailable (scripted outage)")

// warmupUser's message proves the whole path works before the scenario
// starts; it is not counted.
const warmupUser = "demo-warmup"

// recorder is the demo's business Handler: it records, per user, the
// upstream msgids it handled in the order it handled them, and fails
// everything while an outage is on.
type recorder struct {
	outage atomic.Bool
	warm   chan struct{}
	once   sync.Once

	mu       sync.Mutex
	seqs     map[string][]string // user → msgids, first successful handling only
	handled  map[string]int      // msgid → successful handlings (> 1 is a double effect)
	latency  map[string]time.Duration
	failures int
	last     time.Time
	perSec   map[int64]int // unix second → handled
}

func newRecorder() *recorder {
	return &recorder{warm: make(chan struct{}), seqs: map[string][]string{}, handled: map[string]int{},
		latency: map[string]time.Duration{}, perSec: map[int64]int{}}
}

// Handle implements consumer.Handler.
func (r *recorder) Handle(_ context.Context, m *chatmsg.ChatMessage) error {
	if m.ExternalUserID == warmupUser {
		r.once.Do(func() { close(r.warm) })
		return nil
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.outage.Load() {
		r.failures++
		return errOutage
	}
	r.handled[m.UpstreamMsgID]++
	if r.handled[m.UpstreamMsgID] == 1 {
		r.seqs[m.ExternalUserID] = append(r.seqs[m.ExternalUserID], m.UpstreamMsgID)
		if m.ProducedAt > 0 {
			r.latency[m.UpstreamMsgID] = now.Sub(time.UnixMilli(m.ProducedAt))
		}
	}
	r.last = now
	r.perSec[now.Unix()]++
	return nil
}

// processed returns how many distinct messages were handled.
func (r *recorder) processed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handled)
}

// recorded is a copy of what the recorder saw.
type recorded struct {
	seqs     map[string][]string
	handled  map[string]int
	latency  map[string]time.Duration
	failures int
	last     time.Time
	peak     int // most messages handled within one wall-clock second
}

func (r *recorder) snapshot() recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := recorded{seqs: make(map[string][]string, len(r.seqs)), handled: make(map[string]int, len(r.handled)),
		latency: make(map[string]time.Duration, len(r.latency)), failures: r.failures, last: r.last}
	for u, s := range r.seqs {
		out.seqs[u] = append([]string(nil), s...)
	}
	for k, v := range r.handled {
		out.handled[k] = v
	}
	for k, v := range r.latency {
		out.latency[k] = v
	}
	for _, n := range r.perSec {
		out.peak = max(out.peak, n)
	}
	return out
}
