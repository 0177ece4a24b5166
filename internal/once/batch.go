package once

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts of concurrent calls in shared pipelines. One
// collector goroutine gathers operations; Pipelines executor goroutines each
// send one batch at a time. The collector keeps gathering while every
// executor is busy, so batches grow with load and shrink to one operation
// when idle.
type batcher struct {
	rdb       redis.UniversalClient
	maxBatch  int
	linger    time.Duration
	opTimeout time.Duration
	sizes     prometheus.Observer

	in      chan *op   // unbuffered: a caller hands over to the collector directly
	batches chan []*op // unbuffered: a batch is handed to a free executor
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

type op struct {
	script *redis.Script
	key    string
	args   []any
	res    any
	err    error
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
		in:        make(chan *op),
		batches:   make(chan []*op),
		stop:      make(chan struct{}),
	}
	b.wg.Add(1 + cfg.Pipelines)
	go b.collect()
	for range cfg.Pipelines {
		go b.execute()
	}
	return b
}

// do runs s on key in the next pipeline. ctx bounds only the hand-over:
// once the collector has the operation it is sent and its answer awaited,
// so a claim that reached Redis is never abandoned unseen by its caller.
func (b *batcher) do(ctx context.Context, s *redis.Script, key string, args []any) (any, error) {
	o := opPool.Get().(*op)
	o.script, o.key, o.args = s, key, args
	select {
	case b.in <- o:
	case <-ctx.Done():
		b.put(o)
		return nil, ctx.Err()
	case <-b.stop:
		b.put(o)
		return nil, ErrClosed
	}
	<-o.done
	res, err := o.res, o.err
	b.put(o)
	return res, err
}

func (b *batcher) put(o *op) {
	o.script, o.key, o.args, o.res, o.err = nil, "", nil, nil, nil
	opPool.Put(o)
}

// close stops accepting operations, sends the ones already gathered, and
// waits for every pipeline to finish.
func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	b.wg.Wait()
}

func (b *batcher) collect() {
	defer b.wg.Done()
	defer close(b.batches)
	var (
		batch  []*op
		timer  = time.NewTimer(time.Hour)
		linger <-chan time.Time // non-nil while the current batch lingers
	)
	timer.Stop()
	for {
		if len(batch) == 0 {
			select {
			case o := <-b.in:
				batch = append(make([]*op, 0, 16), o)
				if b.linger > 0 {
					timer.Reset(b.linger)
					linger = timer.C
				}
			case <-b.stop:
				return
			}
			continue
		}
		var in chan *op
		if len(batch) < b.maxBatch {
			in = b.in
		}
		var out chan []*op
		if linger == nil || len(batch) >= b.maxBatch {
			out = b.batches
		}
		select {
		case o := <-in:
			batch = append(batch, o)
		case out <- batch:
			batch = nil
			timer.Stop()
			linger = nil
		case <-linger:
			linger = nil
		case <-b.stop:
			b.batches <- batch // operations already accepted are sent
			return
		}
	}
}

func (b *batcher) execute() {
	defer b.wg.Done()
	cmds := make([]*redis.Cmd, 0, b.maxBatch)
	for batch := range b.batches {
		b.sizes.Observe(float64(len(batch)))
		ctx, cancel := context.WithTimeout(context.Background(), b.opTimeout)
		pipe := b.rdb.Pipeline()
		cmds = cmds[:0]
		for _, o := range batch {
			cmds = append(cmds, pipe.EvalSha(ctx, o.script.Hash(), []string{o.key}, o.args...))
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		for i, o := range batch {
			o.res, o.err = cmds[i].Result()
			if o.err != nil && redis.HasErrorPrefix(o.err, "NOSCRIPT") {
				// Redis lost its script cache (restart, SCRIPT FLUSH).
				o.res, o.err = o.script.Run(ctx, b.rdb, []string{o.key}, o.args...).Result()
			}
			o.done <- struct{}{}
		}
		cancel()
	}
}
