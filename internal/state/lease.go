package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Lease is one owner's hold on a partition, from Acquire to Release or its
// loss. It renews itself every Lease/4 while held.
//
// Local deadline: an acquisition or renewal sent at local time t holds the
// lease until at least t+Lease on Redis's clock, so the lease is certainly
// ours until Deadline(); the owner stops starting handlers and sending
// marks by then (Lost is closed). Another owner takes the partition only
// once Redis's own expiry plus the grace (Lease/5) has passed, so a mark
// sent before our deadline reaches Redis before the next owner starts
// unless it spent more than the grace in flight. Such a late mark is
// still recorded and raises hw (see markScript); the next owner sees it in
// every look-up made after it landed (Seen reads Redis, never a copy), but
// an offset it already ran can run twice: that is the stated window.
type Lease struct {
	s         *Store
	topic     string
	partition int32
	tag, key  string
	token     int64
	tokenS    string
	prevHW    int64
	prevOwner string
	ly        atomic.Pointer[layout] // the partition's layout as last read or set

	mu       sync.Mutex
	deadline time.Time
	expires  map[string]time.Time // bucket → when the EXPIRE we last set runs out (local)
	lost     chan struct{}
	lostErr  error
	released bool

	// cutOff, in tests, makes every renewal fail as if Redis were
	// unreachable from this owner only.
	cutOff atomic.Bool
	// marksCutOff, in tests, makes every Mark fail as if Redis did not
	// answer.
	marksCutOff atomic.Bool

	markMu sync.Mutex // one mark in flight: hw only grows in order
	stop   chan struct{}
	done   chan struct{}
}

// grace is how long after a lease ran out on Redis's clock another owner
// waits before taking it.
func (s *Store) grace() time.Duration { return s.cfg.Lease / 5 }

// Acquire takes the partition's lease for this store's owner, waiting
// (bounded by ctx) while another owner holds it and has not given it back
// nor let it expire. The lease renews itself until Release or its loss.
func (s *Store) Acquire(ctx context.Context, topic string, partition int32) (*Lease, error) {
	key := s.ownKey(topic, partition)
	leaseUs := s.cfg.Lease.Microseconds()
	poll := min(s.cfg.Lease/20, 200*time.Millisecond)
	// A count not learnt now is learnt at the next acquisition; it must
	// not keep the partition from its owner.
	_ = s.recordCount(ctx, topic, partition)
	for {
		t0 := time.Now()
		res, err := acquireScript.Run(ctx, s.cfg.Client, []string{key}, s.owner, leaseUs, s.grace().Microseconds(),
			s.cfg.Buckets, s.slotSec, int64(s.cfg.TTL/time.Second)).Slice()
		if err != nil {
			return nil, fmt.Errorf("state: acquire %s/%d: %w", topic, partition, err)
		}
		if len(res) < 3 || toInt(res[0]) == 1 && len(res) < 6 {
			return nil, fmt.Errorf("state: acquire %s/%d: unexpected reply %v", topic, partition, res)
		}
		if toInt(res[0]) == 1 {
			l := &Lease{s: s, topic: topic, partition: partition, tag: s.tag(topic, partition), key: key,
				tokenS: toStr(res[1]), prevHW: toInt(res[2]), prevOwner: toStr(res[3]),
				deadline: t0.Add(s.cfg.Lease), expires: map[string]time.Time{},
				lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
			l.token, _ = strconv.ParseInt(l.tokenS, 10, 64)
			ly := layoutOf(res[4], res[5], nil, nil, nil, s.cfg.Buckets)
			l.ly.Store(&ly)
			go l.renew()
			return l, nil
		}
		wait := min(time.Duration(toInt(res[1]))*time.Microsecond, poll)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("state: acquire %s/%d: held by %s: %w", topic, partition, toStr(res[2]), ctx.Err())
		case <-time.After(max(wait, time.Millisecond)):
		}
	}
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

// Token is the lease's fencing token: larger than every token handed out
// for the partition before it (see the scripts). A downstream that keeps
// the largest token it has seen per partition refuses an older owner.
func (l *Lease) Token() int64 { return l.token }

// Partition returns the lease's topic and partition.
func (l *Lease) Partition() (string, int32) { return l.topic, l.partition }

// PrevHW is the highest offset marked by any owner before this lease was
// taken (-1 when none).
func (l *Lease) PrevHW() int64 { return l.prevHW }

// MayRepeat reports whether the message at offset may have been handled
// by a previous owner: at or below the high-water it recorded. Such
// messages are looked up (Seen) before their handler runs; a later one is
// a first delivery on this partition unless the DLQ or the producer says
// it may repeat (the consumer's rule).
func (l *Lease) MayRepeat(offset int64) bool { return offset <= l.prevHW }

// Lost is closed when the lease is lost (ErrLost or ErrFenced, see Err).
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err returns why the lease was lost; nil while held.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// Deadline is when the lease runs out unless renewed (local clock).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Valid reports whether the lease is held now.
func (l *Lease) Valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr == nil && !l.released && time.Now().Before(l.deadline)
}

func (l *Lease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil && !l.released {
		l.lostErr = err
		close(l.lost)
	}
}

func (l *Lease) renew() {
	defer close(l.done)
	every := l.s.cfg.Lease / 4
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.lost:
			return
		case <-t.C:
		}
		t0 := time.Now()
		// The client's read timeout may exceed the lease (go-redis ignores
		// a context's deadline unless told): the deadline is watched here,
		// not by the call.
		type answer struct {
			n   int64
			err error
		}
		ch := make(chan answer, 1)
		if l.cutOff.Load() {
			ch <- answer{err: errors.New("cut off from Redis (test)")}
		} else {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), l.s.cfg.Lease)
				defer cancel()
				n, err := renewScript.Run(ctx, l.s.cfg.Client, []string{l.key}, l.s.owner, l.tokenS, l.s.cfg.Lease.Microseconds()).Int64()
				ch <- answer{n, err}
			}()
		}
		var a answer
		select {
		case a = <-ch:
		case <-time.After(time.Until(l.Deadline())):
			a = answer{err: errors.New("renewal still unanswered at the deadline")}
		case <-l.stop:
			return
		}
		switch {
		case a.err == nil && a.n == 1:
			l.mu.Lock()
			l.deadline = t0.Add(l.s.cfg.Lease)
			l.mu.Unlock()
			t.Reset(every)
		case a.err == nil:
			l.lose(ErrFenced)
			return
		default:
			dl := l.Deadline()
			if !time.Now().Before(dl) {
				l.lose(fmt.Errorf("%w: not renewed since %s: %v", ErrLost, dl.Add(-l.s.cfg.Lease).Format(time.RFC3339Nano), a.err))
				return
			}
			t.Reset(min(every/4, time.Until(dl)+time.Millisecond))
		}
	}
}

// maxMarkBatch is the most items one mark script call takes.
const maxMarkBatch = 4000

// Mark records items as done, with hw the highest offset they cover, in
// one script call. The marks are recorded even when the lease has moved
// (then ErrFenced: stop, commit nothing more). Any other error means the
// marks may not be recorded: the caller must not commit their offsets.
func (l *Lease) Mark(ctx context.Context, hw int64, items []Item) error {
	if len(items) == 0 {
		return nil
	}
	// Lua unpacks a bucket's digests onto its stack (at most ~8000).
	for len(items) > maxMarkBatch {
		if err := l.Mark(ctx, hw, items[:maxMarkBatch]); err != nil {
			return err
		}
		items = items[maxMarkBatch:]
	}
	l.markMu.Lock()
	defer l.markMu.Unlock()
	for range 3 {
		err := l.markOnce(ctx, hw, items)
		if !errors.Is(err, errStaleLayout) {
			return err
		}
		// Another layout was recorded meanwhile: read it and choose the
		// buckets again.
		if err := l.reloadLayout(ctx); err != nil {
			return err
		}
	}
	return fmt.Errorf("state: mark %s/%d: %w", l.topic, l.partition, errStaleLayout)
}

// errStaleLayout means a mark was chosen buckets under a layout the
// record no longer has: nothing was written.
var errStaleLayout = errors.New("state: layout changed meanwhile")

// layout is the partition's layout as this lease knows it.
func (l *Lease) layout() layout { return *l.ly.Load() }

// reloadLayout reads the partition's layout from its record.
func (l *Lease) reloadLayout(ctx context.Context) error {
	ly, err := readLayout(ctx, l.s.cfg.Client, l.key, l.s.cfg.Buckets)
	if err != nil {
		return err
	}
	l.ly.Store(&ly)
	return nil
}

// markOnce is one mark script call (markMu held).
func (l *Lease) markOnce(ctx context.Context, hw int64, items []Item) error {
	ly := l.layout()
	maxSlot := int64(-1)
	type group struct {
		key     string
		members []any
	}
	idx := map[string]int{}
	var groups []group
	for _, it := range items {
		d := Digest(it.Key)
		k := l.s.bucketKey(l.tag, ly, it.SendTime, d)
		maxSlot = max(maxSlot, l.s.slotOf(it.SendTime))
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, group{key: k})
		}
		groups[i].members = append(groups[i].members, d)
	}
	keys := make([]string, 0, 1+len(groups))
	keys = append(keys, l.key)
	args := make([]any, 0, 3+2*len(groups)+len(items))
	args = append(args, l.s.owner, l.tokenS, hw, ly.ver, maxSlot, l.s.slotSec)
	ttl := l.s.cfg.TTL
	now := time.Now()
	exSec := int64((ttl + ttl/64 + time.Second - 1) / time.Second)
	l.mu.Lock()
	for _, g := range groups {
		keys = append(keys, g.key)
		ex := int64(0)
		// The bucket must live TTL after this write: refresh the expiry
		// when what we set last leaves less than that.
		if e, ok := l.expires[g.key]; !ok || e.Sub(now) < ttl {
			ex = exSec
			l.expires[g.key] = now.Add(time.Duration(exSec) * time.Second)
		}
		args = append(args, len(g.members), ex)
		args = append(args, g.members...)
	}
	if len(l.expires) > 4096 {
		for k, e := range l.expires {
			if e.Sub(now) < ttl {
				delete(l.expires, k)
			}
		}
	}
	l.mu.Unlock()
	n, err := int64(0), error(nil)
	if l.marksCutOff.Load() {
		err = errors.New("cut off from Redis (test)")
	} else {
		n, err = markScript.Run(ctx, l.s.cfg.Client, keys, args...).Int64()
	}
	if err != nil || n == -1 {
		// The expiry we meant to set may not be set (nothing was written
		// when the layout changed meanwhile): set it next time.
		l.mu.Lock()
		for _, g := range groups {
			delete(l.expires, g.key)
		}
		l.mu.Unlock()
		if err == nil {
			return errStaleLayout
		}
		return fmt.Errorf("state: mark %s/%d: %w", l.topic, l.partition, err)
	}
	if n != 1 {
		l.lose(ErrFenced)
		return ErrFenced
	}
	return nil
}

// Seen is Store.Seen on the lease's partition.
func (l *Lease) Seen(ctx context.Context, items []Item) ([]bool, error) {
	return done(l.Look(ctx, items))
}

// Look is Store.Look on the lease's partition.
func (l *Lease) Look(ctx context.Context, items []Item) ([]Status, error) {
	return l.s.look(ctx, l.topic, l.partition, l.layout(), items)
}

// SetLogEnd tells a lease whose partition was never owned under this
// store (PrevHW -1) where the partition's log ended at assignment: while
// Legacy is set, every offset below it may have been handled by a
// consumer of an old store, so MayRepeat says so. No-op otherwise.
func (l *Lease) SetLogEnd(end int64) {
	if l.prevHW < 0 && l.s.legacyOn() {
		l.prevHW = end - 1
	}
}

// Release stops renewing and gives the lease back so the next owner need
// not wait for its expiry. Call it after the last Mark returned.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	already := l.released
	l.released = true
	l.mu.Unlock()
	if already {
		return nil
	}
	close(l.stop)
	<-l.done
	l.markMu.Lock()
	defer l.markMu.Unlock()
	n, err := releaseScript.Run(ctx, l.s.cfg.Client, []string{l.key}, l.s.owner, l.tokenS).Int64()
	if err != nil {
		return fmt.Errorf("state: release %s/%d: %w", l.topic, l.partition, err)
	}
	if n != 1 {
		return ErrFenced
	}
	return nil
}

// Lapse stops renewing without giving the lease back: it runs out at its
// deadline, and the next owner takes it after the grace. For an owner
// whose work under the lease may still run (a handler that did not stop
// when cancelled): giving the lease back would let the next owner run the
// same messages beside it. Marks may still be sent (Mark); they are
// recorded whoever owns the partition.
func (l *Lease) Lapse() {
	l.mu.Lock()
	already := l.released
	l.released = true
	l.mu.Unlock()
	if already {
		return
	}
	close(l.stop)
	<-l.done
}

// errNotHeld is returned by Check for a released lease.
var errNotHeld = errors.New("state: lease not held")

// Check returns nil while the lease is held, else why not.
func (l *Lease) Check() error {
	if l.Valid() {
		return nil
	}
	if err := l.Err(); err != nil {
		return err
	}
	return errNotHeld
}

// relayout asks for bk buckets from slot from on (the record moves it
// after every slot already marked); the lease's layout is what the record
// holds afterwards, changed or not. Only the owner changes a layout.
func (l *Lease) relayout(ctx context.Context, from, bk int64) (changed bool, err error) {
	l.markMu.Lock()
	defer l.markMu.Unlock()
	ly := l.layout()
	// A generation whose slots ended more than twice the TTL before the
	// new one's first slot holds no mark that may still be written (a
	// copy comes back within the TTL of its send) or live (TTL after its
	// write).
	keep := from - 2*int64(l.s.cfg.TTL/time.Second)/l.s.slotSec
	res, err := relayoutScript.Run(ctx, l.s.cfg.Client, []string{l.key}, l.s.owner, l.tokenS, ly.ver, from, bk, keep).Slice()
	if err != nil {
		return false, fmt.Errorf("state: change the layout of %s/%d: %w", l.topic, l.partition, err)
	}
	if len(res) < 3 {
		return false, fmt.Errorf("state: change the layout of %s/%d: unexpected reply %v", l.topic, l.partition, res)
	}
	nl := layoutOf(res[1], res[2], nil, nil, nil, l.s.cfg.Buckets)
	l.ly.Store(&nl)
	return toInt(res[0]) == 1, nil
}

// Buckets is how many buckets the marks of messages sent at sendTime are
// spread over in the lease's partition (as the lease knows its layout).
func (l *Lease) Buckets(sendTime int64) int {
	return int(l.layout().bucketsAt(l.s.slotOf(sendTime)))
}
