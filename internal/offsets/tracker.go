// Package offsets tracks which offsets of a partition are finished so that
// a consumer commits only the contiguous finished prefix (I2). Per-user
// workers finish messages out of offset order; committing a later offset
// before an earlier one is finished would lose the earlier one on a crash.
package offsets

import "sync"

// entry is one in-flight offset.
type entry struct {
	offset int64
	done   bool
}

// Tracker records the offsets of one partition handed to workers and which
// of them are finished. Add is called by the single goroutine that reads
// the partition; Done may be called from any goroutine in any order.
//
// In-flight offsets live in a ring in arrival order (offsets only grow), so
// Add and popping the finished head are O(1); Done finds its entry in O(1)
// when the partition has no gaps and by binary search otherwise.
type Tracker struct {
	partition int32

	mu        sync.Mutex
	ring      []entry // power-of-two capacity
	head      int     // index of the oldest in-flight entry
	n         int     // number of in-flight entries
	committed int64   // next offset to read after the finished prefix; -1 = none yet
	last      int64   // last offset added; -1 = none
}

// NewTracker returns an empty tracker for partition.
func NewTracker(partition int32) *Tracker {
	return &Tracker{partition: partition, ring: make([]entry, 16), committed: -1, last: -1}
}

// Partition returns the partition the tracker was made for.
func (t *Tracker) Partition() int32 { return t.partition }

// Add records that offset was handed out and is not finished. Offsets must
// grow; gaps (transaction markers, compaction) are fine. An offset not
// larger than the last one added is ignored and reported as false.
func (t *Tracker) Add(offset int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset <= t.last {
		return false
	}
	if t.n == len(t.ring) {
		t.grow()
	}
	t.ring[(t.head+t.n)&(len(t.ring)-1)] = entry{offset: offset}
	t.n++
	t.last = offset
	return true
}

func (t *Tracker) grow() {
	r := make([]entry, 2*len(t.ring))
	for i := 0; i < t.n; i++ {
		r[i] = t.ring[(t.head+i)&(len(t.ring)-1)]
	}
	t.ring, t.head = r, 0
}

// Done marks offset finished. It reports false when offset is not in
// flight (never added, already done, or older than the committed prefix).
func (t *Tracker) Done(offset int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.find(offset)
	if !ok || t.ring[i].done {
		return false
	}
	t.ring[i].done = true
	// Pop the finished head; each entry is popped once, so this is O(1)
	// amortised over the entries added.
	mask := len(t.ring) - 1
	for t.n > 0 && t.ring[t.head].done {
		t.committed = t.ring[t.head].offset + 1
		t.head = (t.head + 1) & mask
		t.n--
	}
	return true
}

// find returns the ring index of offset. Without gaps, offset-headOffset is
// the position; with gaps, binary search over the ordered ring.
func (t *Tracker) find(offset int64) (int, bool) {
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.ring) - 1
	first := t.ring[t.head].offset
	pos := offset - first
	if pos < 0 || offset > t.last {
		return 0, false
	}
	if pos < int64(t.n) {
		if i := (t.head + int(pos)) & mask; t.ring[i].offset == offset {
			return i, true
		}
	}
	lo, hi := 0, t.n
	if pos < int64(t.n) {
		hi = int(pos) + 1 // gaps only make an offset's position smaller
	}
	for lo < hi {
		mid := (lo + hi) / 2
		if t.ring[(t.head+mid)&mask].offset < offset {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < t.n {
		if i := (t.head + lo) & mask; t.ring[i].offset == offset {
			return i, true
		}
	}
	return 0, false
}

// Committable returns the offset to commit (Kafka semantics: the next
// offset to read), which is one past the contiguous finished prefix. ok is
// false until the first offset is finished. The value never goes down.
func (t *Tracker) Committable() (next int64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.committed, t.committed >= 0
}

// Oldest returns the oldest offset added and not yet part of the finished
// prefix; ok is false when nothing is in flight.
func (t *Tracker) Oldest() (offset int64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return 0, false
	}
	return t.ring[t.head].offset, true
}

// InFlight returns how many added offsets are not yet part of the finished
// prefix (finished ones behind an unfinished one still count: they are not
// committable).
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// FinishedAbove returns, in order, the finished offsets behind the oldest
// unfinished one: finished, but not committable yet because an earlier
// offset is still in flight.
func (t *Tracker) FinishedAbove() []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int64
	mask := len(t.ring) - 1
	for i := 0; i < t.n; i++ {
		if e := t.ring[(t.head+i)&mask]; e.done {
			out = append(out, e.offset)
		}
	}
	return out
}
