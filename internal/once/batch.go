package once

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// batcher sends the commands of concurrent calls in shared pipelines.
// Callers append to a queue under a mutex; Pipelines executor goroutines
// each take up to MaxBatch queued operations, send them as one pipeline and
// hand every caller its answer. The queue grows while every executor is
// busy, so batches grow with load and shrink to one operation when idle.
//
// There is no collector goroutine between callers and executors: an
// operation costs one wake-up (its answer), which matters when thousands of
// actors each make two operations per message.
type batcher struct {
	rdb       redis.UniversalClient
	maxBatch  int
	linger    time.Duration
	opTimeout time.Duration
	sizes     prometheus.Observer

	// inflight counts pipelines being sent: a batch lingers only while
	// another one is out, since only then can waiting gather more.
	inflight atomic.Int32

	mu     sync.Mutex
	queue  []*op
	since  time.Time // when the queue became non-empty; only with linger
	closed bool

	// kick wakes one idle executor. It holds a token whenever the queue may
	// be non-empty with no executor about to look at it: a caller that
	// finds the queue empty sends one, and an executor that leaves
	// operations behind passes one on.
	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

type op struct {
	// args is the whole command ("set", key, … or "evalsha", sha, 1, key, …).
	args []any
	// script, when set, is the script args runs by hash: it is sent again
	// in full when Redis lost its script cache.
	script *redis.Script
	res    any
	err    error
	// cb, when set, receives the answer on the executor's goroutine instead
	// of a waiting caller (sendAsync).
	cb func(res any, err error)
	// done has room for the one answer so the executor never blocks on a
	// caller; the caller always waits for it.
	done chan struct{}
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

func newBatcher(rdb redis.UniversalClient, cfg BatchConfig, opTimeout time.Duration, sizes prometheus.Observer) *batcher {
	b := &batcher{
		rdb:       rdb,
		maxBatch:  cfg.MaxBatch,
		linger:    cfg.FlushInterval,
		opTimeout: opTimeout,
		sizes:     sizes,
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	b.wg.Add(cfg.Pipelines)
	for range cfg.Pipelines {
		go b.execute()
	}
	return b
}

// do sends args (with script, the EVALSHA of that script) in the next
// pipeline. ctx bounds only the hand-over: once queued the operation is sent
// and its answer awaited, so a claim that reached Redis is never abandoned
// unseen by its caller.
func (b *batcher) do(ctx context.Context, script *redis.Script, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := opPool.Get().(*op)
	o.script, o.args = script, args
	if !b.enqueue(o) {
		b.put(o)
		return nil, ErrClosed
	}
	<-o.done
	res, err := o.res, o.err
	b.put(o)
	return res, err
}

// doAll queues cmds (each with its script, or nil; scripts itself may be nil
// when none is) as consecutive operations
// under one lock, so they travel in the same pipeline when it has room, and
// waits for all their answers: one wake-up for the caller instead of one per
// command. ctx bounds only the hand-over, as in do.
func (b *batcher) doAll(ctx context.Context, scripts []*redis.Script, cmds [][]any, res []any, errs []error) {
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	ops := make([]*op, len(cmds))
	for i := range cmds {
		o := opPool.Get().(*op)
		o.script, o.args = scriptAt(scripts, i), cmds[i]
		ops[i] = o
	}
	if !b.enqueue(ops...) {
		for i, o := range ops {
			b.put(o)
			errs[i] = ErrClosed
		}
		return
	}
	for i, o := range ops {
		<-o.done
		res[i], errs[i] = o.res, o.err
		b.put(o)
	}
}

// sendAsync queues args like do but does not wait: cb gets the answer on
// an executor's goroutine, so it must be quick and must not wait for
// another operation of this batcher. When the batcher is closed cb gets
// ErrClosed at once, on the caller's goroutine.
func (b *batcher) sendAsync(script *redis.Script, args []any, cb func(res any, err error)) {
	o := opPool.Get().(*op)
	o.script, o.args, o.cb = script, args, cb
	if !b.enqueue(o) {
		b.put(o)
		cb(nil, ErrClosed)
	}
}

// enqueue appends ops to the queue as consecutive operations and wakes an
// executor when the queue was empty or reached a full batch; false when
// the batcher is closed (nothing was queued).
func (b *batcher) enqueue(ops ...*op) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	first := len(b.queue) == 0
	if first && b.linger > 0 {
		b.since = time.Now()
	}
	b.queue = append(b.queue, ops...)
	n := len(b.queue)
	b.mu.Unlock()
	// The first operation wakes an executor; a full batch wakes another
	// one in case the first is lingering.
	if first || n >= b.maxBatch && n-len(ops) < b.maxBatch {
		b.wake()
	}
	return true
}

func (b *batcher) wake() {
	select {
	case b.kick <- struct{}{}:
	default: // a token is pending: an executor will look
	}
}

func (b *batcher) put(o *op) {
	o.script, o.args, o.res, o.err, o.cb = nil, nil, nil, nil, nil
	opPool.Put(o)
}

// close stops accepting operations, sends the ones already queued, and
// waits for every pipeline to finish.
func (b *batcher) close() {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		close(b.stop)
	})
	b.wg.Wait()
}

// take removes the next batch from the queue; nil when it is empty. With a
// linger, while the queue is shorter than a batch and another pipeline is in
// flight, it waits until the oldest operation has waited the linger (or the
// batcher stops). With every pipeline idle, waiting could only add latency.
func (b *batcher) take(timer *time.Timer) []*op {
	for {
		b.mu.Lock()
		n := len(b.queue)
		if n == 0 {
			b.mu.Unlock()
			return nil
		}
		if b.linger > 0 && n < b.maxBatch && !b.closed && b.inflight.Load() > 0 {
			if wait := b.linger - time.Since(b.since); wait > 0 {
				b.mu.Unlock()
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-b.stop:
					timer.Stop()
				}
				continue
			}
		}
		n = min(n, b.maxBatch)
		batch := make([]*op, n)
		copy(batch, b.queue)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		if rest > 0 {
			b.wake() // another idle executor takes the rest
		}
		return batch
	}
}

func (b *batcher) execute() {
	defer b.wg.Done()
	cmds := make([]*redis.Cmd, 0, b.maxBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		batch := b.take(timer)
		if batch == nil {
			select {
			case <-b.kick:
				continue
			case <-b.stop:
				// Closed: callers can no longer queue; send what is left.
				if batch = b.take(timer); batch == nil {
					return
				}
			}
		}
		cmds = b.send(batch, cmds)
	}
}

func (b *batcher) send(batch []*op, cmds []*redis.Cmd) []*redis.Cmd {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	b.sizes.Observe(float64(len(batch)))
	ctx, cancel := context.WithTimeout(context.Background(), b.opTimeout)
	defer cancel()
	pipe := b.rdb.Pipeline()
	cmds = cmds[:0]
	for _, o := range batch {
		cmds = append(cmds, pipe.Do(ctx, o.args...))
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	for i, o := range batch {
		o.res, o.err = cmds[i].Result()
		if o.err != nil && o.script != nil && redis.HasErrorPrefix(o.err, "NOSCRIPT") {
			// Redis lost its script cache (restart, SCRIPT FLUSH).
			o.res, o.err = runScript(ctx, b.rdb, o.script, o.args)
		}
		if cb := o.cb; cb != nil {
			res, err := o.res, o.err
			b.put(o)
			cb(res, err)
		} else {
			o.done <- struct{}{}
		}
		cmds[i] = nil
	}
	return cmds
}
