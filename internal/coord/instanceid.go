package coord

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// InstanceIDAllocator hands out IDs in [1, maxID] for the instances of one
// service (seed 000): an ID is held by the key instance_ids/<service>/<id>,
// created only if absent and bound to the allocator's lease, which is kept
// alive in the background. A holder that dies stops renewing the lease and
// etcd deletes its keys when it expires (Config.KeepAlive later); a closed
// ID is deleted at once. The lowest free ID is taken, so freed IDs are
// reused.
type InstanceIDAllocator struct {
	p       *Provider
	service string
	maxID   int

	mu   sync.Mutex
	sess *concurrency.Session // nil until the first AcquireID, and after a loss
	loss *leaseLoss           // reports the loss of sess once
	held map[int]*AllocatedID
}

// AllocatedID is one ID held by this process.
type AllocatedID struct {
	a    *InstanceIDAllocator
	id   int
	key  string
	sess *concurrency.Session
	loss *leaseLoss

	once sync.Once
	done chan struct{}
	err  error // why it ended (nil: closed); set before done is closed
}

// InstanceIDAllocator returns the allocator of service, creating it on the
// first call; later calls with the same service return the same allocator
// (and fail if maxID differs).
func (p *Provider) InstanceIDAllocator(service string, maxID int) (*InstanceIDAllocator, error) {
	if err := checkSegment("service name", service); err != nil {
		return nil, err
	}
	if maxID < 1 {
		return nil, fmt.Errorf("coord: instance id allocator %q: maxID must be >= 1, got %d", service, maxID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if a := p.allocs[service]; a != nil {
		if a.maxID != maxID {
			return nil, fmt.Errorf("coord: instance id allocator %q exists with maxID %d, asked for %d", service, a.maxID, maxID)
		}
		return a, nil
	}
	a := &InstanceIDAllocator{p: p, service: service, maxID: maxID, held: make(map[int]*AllocatedID)}
	p.allocs[service] = a
	return a, nil
}

func (a *InstanceIDAllocator) dir() string { return dirInstanceIDs + a.service + "/" }

// AcquireID claims the lowest free ID. ErrNoFreeID when all maxID are held.
func (a *InstanceIDAllocator) AcquireID(ctx context.Context) (*AllocatedID, error) {
	p := a.p
	ctx, cancel := p.bind(ctx)
	defer cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.isClosed() {
		return nil, ErrClosed
	}
	sess, err := a.session(ctx)
	if err != nil {
		return nil, fmt.Errorf("coord: acquire %s instance id: %w", a.service, err)
	}
	for {
		resp, err := p.cli.Get(ctx, a.dir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("coord: acquire %s instance id: read held ids: %w", a.service, err)
		}
		taken := make(map[int]bool, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			if id, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), a.dir())); err == nil {
				taken[id] = true
			}
		}
		free := false
		for id := 1; id <= a.maxID; id++ {
			if taken[id] {
				continue
			}
			free = true
			key := a.dir() + strconv.Itoa(id)
			tr, err := p.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, p.owner, clientv3.WithLease(sess.Lease()))).
				Commit()
			if err != nil {
				return nil, fmt.Errorf("coord: acquire %s instance id %d: %w", a.service, id, err)
			}
			if tr.Succeeded {
				aid := &AllocatedID{a: a, id: id, key: key, sess: sess, loss: a.loss, done: make(chan struct{})}
				if err := p.spawn(func() { a.guard(aid, tr.Header.Revision) }); err != nil {
					return nil, err
				}
				a.held[id] = aid
				p.log.Info("instance id acquired", zap.String("service", a.service), zap.Int("id", id),
					zap.Int64("lease", int64(sess.Lease())))
				return aid, nil
			}
			// Taken since the read; the next free one may not be.
		}
		if !free {
			return nil, fmt.Errorf("%w: %s has all %d ids held", ErrNoFreeID, a.service, a.maxID)
		}
		// Every ID free at the read was taken since: read again.
	}
}

// session returns the live lease of the allocator, granting a new one (and
// watching it) when there is none. Called with a.mu held.
func (a *InstanceIDAllocator) session(ctx context.Context) (*concurrency.Session, error) {
	if a.sess != nil && !isDone(a.sess.Done()) {
		return a.sess, nil
	}
	sess, err := a.p.newSession(ctx, a.p.cfg.KeepAlive)
	if err != nil {
		return nil, err
	}
	loss := a.p.newLeaseLoss(kindInstanceID)
	if err := a.p.monitor(loss, sess, nil, func() { a.lost(sess) }); err != nil {
		_ = a.p.closeSession(ctx, sess)
		return nil, err
	}
	a.sess, a.loss = sess, loss
	return sess, nil
}

// lost ends every ID held on sess: its lease expired, so another instance
// may hold them now.
func (a *InstanceIDAllocator) lost(sess *concurrency.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, aid := range a.held {
		if aid.sess == sess {
			aid.endWith(ErrIDLost)
			delete(a.held, id)
			a.p.log.Error("instance id lost with its lease", zap.String("service", a.service), zap.Int("id", id))
		}
	}
	if a.sess == sess {
		a.sess = nil
	}
}

// close revokes the allocator's lease, deleting every ID it holds; for
// Provider.Close.
func (a *InstanceIDAllocator) close(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, aid := range a.held {
		aid.end()
		delete(a.held, id)
	}
	if a.sess == nil {
		return nil
	}
	sess := a.sess
	a.sess = nil
	if err := a.p.closeSession(ctx, sess); err != nil {
		return fmt.Errorf("coord: release %s instance ids: %w", a.service, err)
	}
	return nil
}

// ID returns the allocated ID.
func (id *AllocatedID) ID() int { return id.id }

// Key returns the etcd key that holds the ID, relative to the namespace.
func (id *AllocatedID) Key() string { return id.key }

// Done returns a channel closed when the ID is no longer held: Close, the
// Provider's Close, or its lease lost (then another instance may hold it
// now, and this one must stop using it).
func (id *AllocatedID) Done() <-chan struct{} { return id.done }

func (id *AllocatedID) end() { id.endWith(nil) }

func (id *AllocatedID) endWith(err error) {
	id.once.Do(func() {
		id.err = err
		close(id.done)
	})
}

// Err reports why Done was closed: ErrIDLost (the lease expired),
// ErrIDTaken (the key was deleted or rewritten by someone else), or nil
// (closed, or still held).
func (id *AllocatedID) Err() error {
	select {
	case <-id.done:
		return id.err
	default:
		return nil
	}
}

// guard watches the key of aid from rev on (the revision of its creation)
// until aid ends: a delete or a write by anyone else ends aid with
// ErrIDTaken. A broken or compacted watch is resumed after the key is read
// again, from the revision of that read, so no change goes unseen and a
// compaction does not make it loop.
func (a *InstanceIDAllocator) guard(aid *AllocatedID, rev int64) {
	p := a.p
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	go func() {
		select {
		case <-aid.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	lease := int64(aid.sess.Lease())
	taken := func(why string) {
		if why == "deleted" {
			// etcd deletes the key when the lease expires, maybe before
			// the session notices: then the ID was lost, not taken.
			if ttl, err := p.cli.TimeToLive(ctx, aid.sess.Lease()); err == nil && ttl.TTL <= 0 {
				aid.loss.report(aid.sess)
				a.lost(aid.sess)
				return
			}
		}
		a.mu.Lock()
		if a.held[aid.id] == aid {
			delete(a.held, aid.id)
		}
		a.mu.Unlock()
		aid.endWith(ErrIDTaken)
		p.log.Error("instance id taken from us", zap.String("service", a.service), zap.Int("id", aid.id), zap.String("why", why))
	}
	for ctx.Err() == nil {
		for wr := range p.cli.Watch(clientv3.WithRequireLeader(ctx), aid.key, clientv3.WithRev(rev+1)) {
			if err := wr.Err(); err != nil {
				break
			}
			for _, ev := range wr.Events {
				rev = ev.Kv.ModRevision
				if ev.Type == mvccpb.DELETE {
					if isDone(aid.done) {
						return // our own Close
					}
					taken("deleted")
					return
				}
				if ev.Kv.Lease != lease {
					taken(fmt.Sprintf("rewritten with lease %x", ev.Kv.Lease))
					return
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (leader lost, compaction, connection): read the
		// key again and go on from there.
		for ctx.Err() == nil {
			resp, err := p.cli.Get(ctx, aid.key)
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			switch {
			case isDone(aid.done):
				return
			case len(resp.Kvs) == 0:
				taken("deleted")
				return
			case resp.Kvs[0].Lease != lease:
				taken(fmt.Sprintf("rewritten with lease %x", resp.Kvs[0].Lease))
				return
			}
			rev = resp.Header.Revision
			break
		}
	}
}

// Close frees the ID at once (deleting its key, if still ours) so another
// instance can take it. Calling it again does nothing.
func (id *AllocatedID) Close(ctx context.Context) error {
	a := id.a
	a.mu.Lock()
	mine := a.held[id.id] == id
	if mine {
		delete(a.held, id.id)
	}
	a.mu.Unlock()
	id.end()
	if !mine {
		return nil
	}
	_, err := a.p.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(id.key), "=", id.sess.Lease())).
		Then(clientv3.OpDelete(id.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("coord: release %s instance id %d: %w", a.service, id.id, err)
	}
	a.p.log.Info("instance id released", zap.String("service", a.service), zap.Int("id", id.id))
	return nil
}
