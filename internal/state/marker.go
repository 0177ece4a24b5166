package state

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Marker batches a lease's marks for the consumer: Add queues one handled
// message; one goroutine sends what is queued, as one Mark call, when
// maxBatch are queued or flush after the oldest was queued, one call at a
// time so the partition's hw only grows. Each message's done is called
// once, after its call: nil when recorded under the lease, ErrFenced when
// recorded but the lease has moved (stop, commit nothing more), or the
// error of Close when the marker stopped before the mark could be
// recorded (do not commit its offset). A call Redis failed is sent again
// after a backoff, for as long as the marker runs.
type Marker struct {
	l        *Lease
	flush    time.Duration
	maxBatch int

	mu      sync.Mutex
	queue   []pending
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
	sends   int // Mark calls made (tests)
	// failing is set while the last Mark call failed (Redis did not
	// answer): the marks cannot be written. progress is closed (and
	// replaced) whenever a call returns, so that Admit looks again.
	failing  bool
	progress chan struct{}

	// The observed rate, by send-time slot (run's goroutine only): marks
	// per slot for the last few slots, the highest slot seen, and the
	// first slot of the last layout change this marker made.
	perSlot    map[int64]int
	first, top int64
	lastChange int64
}

type pending struct {
	it   Item
	off  int64
	at   time.Time // when it was queued
	done func(error)
}

// ErrMarkerClosed is given to the done of marks not recorded when the
// marker was closed.
var ErrMarkerClosed = errors.New("state: marker closed before the mark was recorded")

// NewMarker starts a marker on l.
func (l *Lease) NewMarker(flush time.Duration, maxBatch int) *Marker {
	m := &Marker{l: l, flush: max(flush, time.Millisecond), maxBatch: max(maxBatch, 1),
		wake: make(chan struct{}, 1), stopped: make(chan struct{}), progress: make(chan struct{}),
		perSlot: map[int64]int{}, first: -1, top: -1, lastChange: -1 << 62}
	go m.run()
	return m
}

// Add queues a mark for the message at off.
func (m *Marker) Add(it Item, off int64, done func(error)) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		done(ErrMarkerClosed)
		return
	}
	m.queue = append(m.queue, pending{it, off, time.Now(), done})
	full := len(m.queue) >= m.maxBatch
	first := len(m.queue) == 1
	m.mu.Unlock()
	if full || first {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// MaxMarkLag is how long a handled message's mark may stay unwritten
// before Admit holds the partition's next attempt: the bound of the
// effect→mark window while Redis answers (issue 43).
const MaxMarkLag = time.Second

// Admit returns when the partition may start another handler attempt
// (an effect): at once while its marks are being written in time; it
// waits while the oldest mark queued is older than MaxMarkLag (or twice
// the flush interval, when longer), and while the last attempt to write
// marks failed (Redis does not answer: no new effect at all until one
// lands). It returns ctx's error when ctx ends first, and
// ErrMarkerClosed once the marker was closed (the lease is gone). The
// consumer calls it before every attempt, so a kill -9 leaves at most the
// marks of the attempts that ended in the last MaxMarkLag unwritten.
func (m *Marker) Admit(ctx context.Context) error {
	lag := max(MaxMarkLag, 2*m.flush)
	for {
		m.mu.Lock()
		closed, failing, progress := m.closed, m.failing, m.progress
		var wait time.Duration
		if !failing && len(m.queue) > 0 {
			wait = lag - time.Since(m.queue[0].at)
		}
		m.mu.Unlock()
		switch {
		case closed:
			return ErrMarkerClosed
		case !failing && wait >= 0:
			return nil
		}
		t := time.NewTimer(lag / 4)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-progress:
		case <-t.C:
		}
		t.Stop()
	}
}

// Close sends what is queued (one last try each) and stops; it returns when
// every done was called.
func (m *Marker) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
	<-m.stopped
}

func (m *Marker) run() {
	defer close(m.stopped)
	backoff := 10 * time.Millisecond
	for {
		m.mu.Lock()
		n, closed := len(m.queue), m.closed
		m.mu.Unlock()
		if n == 0 {
			if closed {
				return
			}
			<-m.wake
			continue
		}
		if n < m.maxBatch && !closed {
			// Let a batch gather, unless it fills up or the marker closes.
			t := time.NewTimer(m.flush)
			select {
			case <-t.C:
			case <-m.wake:
				t.Stop()
				m.mu.Lock()
				n, closed = len(m.queue), m.closed
				m.mu.Unlock()
				if n < m.maxBatch && !closed {
					continue
				}
			}
		}
		m.mu.Lock()
		k := min(len(m.queue), m.maxBatch)
		batch := append([]pending(nil), m.queue[:k]...)
		m.mu.Unlock()
		items := make([]Item, len(batch))
		hw := int64(-1)
		for i, p := range batch {
			items[i] = p.it
			hw = max(hw, p.off)
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.l.s.cfg.Lease)
		m.adapt(ctx, items)
		err := m.l.Mark(ctx, hw, items)
		cancel()
		m.mu.Lock()
		m.sends++
		closed = m.closed
		m.failing = err != nil && !errors.Is(err, ErrFenced)
		close(m.progress)
		m.progress = make(chan struct{})
		m.mu.Unlock()
		if err != nil && !errors.Is(err, ErrFenced) && !closed {
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue // the same batch again
		}
		backoff = 10 * time.Millisecond
		if err != nil && !errors.Is(err, ErrFenced) {
			err = errors.Join(ErrMarkerClosed, err)
		}
		m.mu.Lock()
		m.queue = append(m.queue[:0], m.queue[k:]...)
		m.mu.Unlock()
		for _, p := range batch {
			p.done(err)
		}
	}
}

// Layout adaptation. A bucket keeps to an intset (8 B a mark) up to
// MaxIntset members and costs a key's overhead (~100 B) however few it
// holds: the marker sizes each new slot from the marks of the last full
// slot it saw (the one before the last: see adapt), at about bucketTarget
// a bucket. It grows as soon as a slot held more than bucketGrow a bucket,
// the slot still filling included (from the next slot on: a jump costs
// one slot of oversized buckets), and shrinks when a full slot held less than
// a quarter of the target a bucket, at most once per shrinkEvery slots
// (each change is a generation the record keeps while its marks live).
const (
	bucketTarget = 400
	bucketGrow   = 448
	shrinkEvery  = 60
)

// bucketsFor is the bucket count that keeps n marks a slot at most
// bucketTarget a bucket: a power of two.
func bucketsFor(n int) int64 {
	b := int64(1)
	for b*bucketTarget < int64(n) && b < MaxBuckets {
		b *= 2
	}
	return b
}

// adapt counts items by slot and, when they open a slot later than any
// seen, sizes it from the last full slot's count (a layout change from
// that slot on, when the count calls for one). A failed change is left to
// the next slot: the marks go under the recorded layout either way.
func (m *Marker) adapt(ctx context.Context, items []Item) {
	top := int64(-1)
	for _, it := range items {
		sl := m.l.s.slotOf(it.SendTime)
		top = max(top, sl)
		m.perSlot[sl]++
	}
	if m.first < 0 {
		m.first = top
	}
	if top > m.top {
		// The last full slot: the highest below the one before top. A
		// slot's last marks come after the next slot's first ones (the
		// partition's customers are handled concurrently, and one behind
		// in its queue marks late), so the slot just before top is still
		// filling; by the time the slot after next opens, a slot is
		// counted whole. The first slot this marker saw may have been seen
		// in part (the lease was taken in it): it sizes nothing.
		full := int64(-1)
		for sl := range m.perSlot {
			if sl < top-1 {
				full = max(full, sl)
			}
		}
		if full > m.first {
			n := m.perSlot[full]
			// The slot still filling holds at least what it counts so
			// far: enough to grow on (a jump costs one slot of oversized
			// buckets, not two), never to shrink on.
			grow := n
			if top-1 > m.first {
				grow = max(grow, m.perSlot[top-1])
			}
			cur := m.l.layout().bucketsAt(top)
			want := cur
			switch {
			case int64(grow) > cur*bucketGrow && bucketsFor(grow) > cur:
				want = bucketsFor(grow)
			case bucketsFor(n)*4 <= cur && top-m.lastChange >= shrinkEvery:
				want = bucketsFor(n)
			}
			if want != cur {
				if changed, err := m.l.relayout(ctx, top, want); err == nil && changed {
					m.lastChange = top
				}
			}
		}
		m.top = top
	}
	for sl := range m.perSlot {
		if sl < m.top-2 {
			delete(m.perSlot, sl)
		}
	}
}
