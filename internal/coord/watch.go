package coord

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Pause between attempts to re-establish a watch or reload its state, and
// between re-registrations: doubled on each failure up to maxRetry.
const (
	minRetry = 50 * time.Millisecond
	maxRetry = 2 * time.Second
)

type backoff struct{ d time.Duration }

// wait pauses for the current delay and doubles it; false when ctx ended.
func (b *backoff) wait(ctx context.Context) bool {
	if b.d == 0 {
		b.d = minRetry
	}
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-t.C:
		b.d = min(2*b.d, maxRetry)
		return true
	case <-ctx.Done():
		return false
	}
}

func (b *backoff) reset() { b.d = 0 }

// follower receives what follow sees. Each function returns false when ctx
// ended before it had delivered everything.
type follower struct {
	// events are changes in revision order.
	events func(ctx context.Context, evs []*clientv3.Event) bool
	// snapshot is the whole watched state at revision rev, after the
	// changes since the last delivered revision were compacted away.
	snapshot func(ctx context.Context, rev int64, kvs []*mvccpb.KeyValue) bool
}

// load reads key (every key under it when prefix) and the revision of the
// read.
func (p *Provider) load(ctx context.Context, key string, prefix bool) (int64, []*mvccpb.KeyValue, error) {
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := p.cli.Get(ctx, key, opts...)
	if err != nil {
		return 0, nil, fmt.Errorf("read %q: %w", key, err)
	}
	return resp.Header.Revision, resp.Kvs, nil
}

// follow hands f every change of key (of every key under it when prefix)
// after revision rev, in order and each once, until ctx ends.
//
// clientv3 already resumes a watch across reconnects; follow also survives
// what ends an etcd watch: a leader loss (WithRequireLeader makes the
// member cancel a watch it can no longer serve, instead of leaving it
// silent), a cancellation by the server, and compaction. It re-watches from
// next — the revision after the last delivered event — so nothing is missed
// or repeated; when next has been compacted it reloads the state and hands
// f a snapshot instead.
func (p *Provider) follow(ctx context.Context, key string, prefix bool, rev int64, f follower) {
	next := rev + 1
	var retry backoff
	for {
		opts := []clientv3.OpOption{clientv3.WithRev(next)}
		if prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		var compacted int64
		var werr error
		for wr := range p.cli.Watch(wctx, key, opts...) {
			if wr.CompactRevision != 0 {
				compacted = wr.CompactRevision
				break
			}
			if werr = wr.Err(); werr != nil {
				break
			}
			if len(wr.Events) == 0 {
				continue
			}
			if !f.events(ctx, wr.Events) {
				cancel()
				return
			}
			next = wr.Events[len(wr.Events)-1].Kv.ModRevision + 1
			retry.reset()
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.m.restarts.Inc()
		if compacted == 0 {
			p.log.Info("watch ended: resuming", zap.String("key", key), zap.Int64("from_revision", next), zap.Error(werr))
			if !retry.wait(ctx) {
				return
			}
			continue
		}
		p.m.resyncs.Inc()
		p.log.Warn("watch revision compacted: reloading", zap.String("key", key),
			zap.Int64("from_revision", next), zap.Int64("compacted_revision", compacted))
		for {
			r, kvs, err := p.load(ctx, key, prefix)
			if err == nil {
				if !f.snapshot(ctx, r, kvs) {
					return
				}
				next = r + 1
				break
			}
			p.log.Warn("watch reload failed: retrying", zap.String("key", key), zap.Error(err))
			if !retry.wait(ctx) {
				return
			}
		}
	}
}

// send delivers e unless ctx ends first.
func send[E any](ctx context.Context, ch chan<- E, e E) bool {
	select {
	case ch <- e:
		return true
	case <-ctx.Done():
		return false
	}
}
