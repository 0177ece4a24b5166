package ratelimit

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// blockWriter persists the limiter's blocks off the hot path. Its queue is
// unbounded on purpose: a block is never dropped while the process lives,
// and its size is bounded by the users blocked while Redis is unreachable
// (each user blocks at most once per block duration).
type blockWriter struct {
	store   *Store
	log     *zap.Logger
	timeout time.Duration

	mu      sync.Mutex
	queue   []blockWrite
	pending map[string]blockWrite // newest unwritten block per user, for loads racing the write

	wake chan struct{} // cap 1: a coalesced "the queue is not empty"
	stop chan struct{}
	done chan struct{}
}

func newBlockWriter(store *Store, log *zap.Logger, timeout time.Duration) *blockWriter {
	return &blockWriter{store: store, log: log, timeout: timeout, pending: make(map[string]blockWrite),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

func (w *blockWriter) enqueue(bw blockWrite) {
	w.mu.Lock()
	w.queue = append(w.queue, bw)
	w.pending[bw.user] = bw
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// pendingFor returns the newest block of user not yet in Redis.
func (w *blockWriter) pendingFor(user string) (blockWrite, bool) {
	if w == nil {
		return blockWrite{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	bw, ok := w.pending[user]
	return bw, ok
}

// run writes until close. Retries back off on the wall clock: the delay only
// decides how soon Redis is asked again, no decision depends on it, so it
// needs no injected Clock.
func (w *blockWriter) run() {
	defer close(w.done)
	const minBackoff, maxBackoff = 50 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	for {
		select {
		case <-w.wake:
		case <-w.stop:
			w.final()
			return
		}
		for !w.flush() {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-w.stop:
				t.Stop()
				w.final()
				return
			}
			backoff = min(2*backoff, maxBackoff)
		}
		backoff = minBackoff
	}
}

// flush writes everything queued; it reports whether all of it was written.
func (w *blockWriter) flush() bool {
	w.mu.Lock()
	batch := w.queue
	w.queue = nil
	w.mu.Unlock()
	if len(batch) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	failed, err := w.store.writeBlocks(ctx, batch)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, bw := range batch {
		if p, ok := w.pending[bw.user]; ok && p == bw {
			delete(w.pending, bw.user)
		}
	}
	if len(failed) == 0 {
		return true
	}
	for _, bw := range failed {
		if _, ok := w.pending[bw.user]; !ok {
			w.pending[bw.user] = bw
		}
	}
	w.queue = append(failed, w.queue...)
	w.log.Warn("write rate-limit blocks; will retry", zap.Int("failed", len(failed)), zap.Error(err))
	return false
}

// final makes one last attempt at close and reports what could not be written.
func (w *blockWriter) final() {
	if !w.flush() {
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		w.log.Error("rate-limit blocks not persisted at close; they end with this process", zap.Int("blocks", n))
	}
}

func (w *blockWriter) close() {
	close(w.stop)
	<-w.done
}
