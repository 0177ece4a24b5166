package state

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Looker batches the look-ups of many callers (the consumer's actors, one
// message each) into one Redis pipeline: while a pipeline is in flight the
// look-ups that arrive wait and go together in the next one, so an idle
// consumer waits for no timer and a busy one makes a round trip per batch,
// not per message. Each look-up still reads Redis after it was asked:
// batching changes when the round trip is made, not what it sees.
type Looker struct {
	s        *Store
	maxBatch int

	mu      sync.Mutex
	queue   []*lookReq
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
}

type lookReq struct {
	l     *Lease
	items []Item
	out   []Status
	err   error
	done  chan struct{}
}

// ErrLookerClosed is returned by Look after Close.
var ErrLookerClosed = errors.New("state: looker closed")

// NewLooker starts a Looker whose pipelines carry at most maxBatch items
// (a single larger look-up still goes whole).
func (s *Store) NewLooker(maxBatch int) *Looker {
	lk := &Looker{s: s, maxBatch: max(maxBatch, 1), wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go lk.run()
	return lk
}

// Look is Lease.Look, batched with the other callers' look-ups.
func (lk *Looker) Look(ctx context.Context, l *Lease, items []Item) ([]Status, error) {
	r := &lookReq{l: l, items: items, done: make(chan struct{})}
	lk.mu.Lock()
	if lk.closed {
		lk.mu.Unlock()
		return nil, ErrLookerClosed
	}
	lk.queue = append(lk.queue, r)
	lk.mu.Unlock()
	select {
	case lk.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.out, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops the Looker after the look-ups queued; later ones fail.
func (lk *Looker) Close() {
	lk.mu.Lock()
	lk.closed = true
	lk.mu.Unlock()
	select {
	case lk.wake <- struct{}{}:
	default:
	}
	<-lk.stopped
}

func (lk *Looker) run() {
	defer close(lk.stopped)
	for {
		lk.mu.Lock()
		n, closed := 0, lk.closed
		k := 0
		for k < len(lk.queue) && (k == 0 || n+len(lk.queue[k].items) <= lk.maxBatch) {
			n += len(lk.queue[k].items)
			k++
		}
		batch := append([]*lookReq(nil), lk.queue[:k]...)
		lk.queue = append(lk.queue[:0], lk.queue[k:]...)
		lk.mu.Unlock()
		if len(batch) == 0 {
			if closed {
				return
			}
			<-lk.wake
			continue
		}
		lk.send(batch)
	}
}

// send makes one pipeline of SMISMEMBER for every bucket the batch's items
// fall in, then the old stores' look-ups of what was not found (Legacy).
func (lk *Looker) send(batch []*lookReq) {
	// One SMISMEMBER a bucket, whichever callers' items fall in it.
	type at struct {
		req *lookReq
		i   int
	}
	type bucket struct {
		key     string
		at      []at
		members []any
	}
	byKey := map[string]*bucket{}
	var buckets []*bucket
	for _, r := range batch {
		r.out = make([]Status, len(r.items))
		for i, it := range r.items {
			d := Digest(it.Key)
			k := lk.s.bucketKey(r.l.tag, r.l.layout(), it.SendTime, d)
			b := byKey[k]
			if b == nil {
				b = &bucket{key: k}
				byKey[k] = b
				buckets = append(buckets, b)
			}
			b.at = append(b.at, at{r, i})
			b.members = append(b.members, d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), lk.s.cfg.Lease)
	defer cancel()
	pipe := lk.s.cfg.Client.Pipeline()
	cmds := make([]*redis.BoolSliceCmd, len(buckets))
	for j, b := range buckets {
		cmds[j] = pipe.SMIsMember(ctx, b.key, b.members...)
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		err = fmt.Errorf("state: look up marks: %w", err)
		for _, r := range batch {
			r.err = err
			close(r.done)
		}
		return
	}
	for j, b := range buckets {
		for n, v := range cmds[j].Val() {
			if v {
				b.at[n].req.out[b.at[n].i] = Done
			}
		}
	}
	for _, r := range batch {
		if err := lk.s.lookMoved(ctx, r.l.topic, r.l.partition, r.items, r.out); err != nil {
			r.err = err
		}
	}
	if lk.s.legacyOn() {
		// One pipeline for the whole batch too.
		var items []Item
		var st []Status
		for _, r := range batch {
			items = append(items, r.items...)
			st = append(st, r.out...)
		}
		err := lk.s.legacyLook(ctx, items, st)
		at := 0
		for _, r := range batch {
			copy(r.out, st[at:at+len(r.out)])
			at += len(r.out)
			r.err = err
		}
	}
	for _, r := range batch {
		close(r.done)
	}
}
