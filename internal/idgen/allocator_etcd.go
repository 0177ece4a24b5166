package idgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdAllocator is the etcd backend of Allocator: the worker-ID key is
// created in a transaction only if it does not exist, bound to a lease, so
// etcd deletes it when the lease is revoked or expires.
type EtcdAllocator struct {
	cli *clientv3.Client
	cfg AllocatorConfig
	log *zap.Logger
	m   *metrics

	mu      sync.Mutex
	id      int
	key     string // "" when none
	rev     int64  // revision of our Put
	lease   clientv3.LeaseID
	stopped bool
	kaStop  context.CancelFunc
	kaDone  chan struct{}
}

var _ Allocator = (*EtcdAllocator)(nil)

// NewEtcdAllocator returns an etcd-backed Allocator; cfg.TTL is rounded up
// to whole seconds (etcd leases count seconds). Options: WithLogger,
// WithRegisterer.
func NewEtcdAllocator(cli *clientv3.Client, cfg AllocatorConfig, opts ...Option) (*EtcdAllocator, error) {
	if cli == nil {
		return nil, errors.New("idgen: etcd allocator needs a client")
	}
	cfg.setDefaults()
	if err := cfg.validate(time.Second); err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	return &EtcdAllocator{cli: cli, cfg: cfg, log: o.logger, m: m}, nil
}

func (a *EtcdAllocator) keyOf(id int) string {
	return a.cfg.Prefix + "idgen/worker/" + strconv.Itoa(id)
}

// Allocate grants a lease and claims a free worker ID with it, scanning the
// pool as a ring from a random start. A second call returns the ID already
// held. Call KeepAlive promptly: until then nothing renews the lease.
func (a *EtcdAllocator) Allocate(ctx context.Context) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return 0, ErrStopped
	}
	if a.key != "" {
		return a.id, nil
	}
	secs := int64((a.cfg.TTL + time.Second - 1) / time.Second)
	lease, err := a.cli.Grant(ctx, secs)
	if err != nil {
		return 0, fmt.Errorf("idgen: grant lease: %w", err)
	}
	start := randomOffset(a.cfg.MaxID)
	for i := range a.cfg.MaxID {
		id := (start + i) % a.cfg.MaxID
		key := a.keyOf(id)
		resp, err := a.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, a.cfg.Owner, clientv3.WithLease(lease.ID))).
			Commit()
		if err != nil {
			a.revoke(lease.ID)
			return 0, fmt.Errorf("idgen: claim worker id %d: %w", id, err)
		}
		if resp.Succeeded {
			a.id, a.key, a.rev, a.lease = id, key, resp.Header.Revision, lease.ID
			a.log.Info("worker id allocated", zap.Int("worker_id", id), zap.String("key", key),
				zap.String("owner", a.cfg.Owner), zap.Int64("lease", int64(lease.ID)))
			return id, nil
		}
	}
	a.revoke(lease.ID)
	return 0, noFreeID(a.cfg.MaxID, a.cfg.Prefix+"idgen/worker/")
}

// revoke drops a lease we will not use; the caller's ctx may be done, so it
// gets its own short deadline. Failure only delays the lease's expiry.
func (a *EtcdAllocator) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.cli.Revoke(ctx, id); err != nil {
		a.log.Warn("revoke unused lease", zap.Int64("lease", int64(id)), zap.Error(err))
	}
}

// ID returns the held worker ID, if any.
func (a *EtcdAllocator) ID() (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id, a.key != ""
}

// KeepAlive keeps the lease alive (the etcd client renews at a third of its
// TTL) and watches the key. A lost lease sends ErrLeaseExpired; the key
// deleted or rewritten by someone else sends ErrKeyStolen; either closes
// the channel.
func (a *EtcdAllocator) KeepAlive(ctx context.Context) <-chan error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopped:
		return closedErr(ErrStopped)
	case a.key == "":
		return closedErr(ErrNotAllocated)
	case a.kaDone != nil:
		return closedErr(errors.New("idgen: keepalive already running"))
	}
	errc := make(chan error, 1) // only one error is ever sent
	kctx, cancel := context.WithCancel(ctx)
	a.kaStop, a.kaDone = cancel, make(chan struct{})
	go a.keepAlive(kctx, a.id, a.key, a.rev, a.lease, errc, a.kaDone)
	return errc
}

func (a *EtcdAllocator) keepAlive(ctx context.Context, id int, key string, rev int64, lease clientv3.LeaseID,
	errc chan<- error, done chan<- struct{}) {
	defer close(done)
	defer close(errc)
	fail := func(reason string, err error) {
		a.m.errors.WithLabelValues(reason).Inc()
		sendFatal(ctx, errc, err)
	}
	kac, err := a.cli.KeepAlive(ctx, lease)
	if err != nil {
		if ctx.Err() == nil {
			fail(reasonLeaseExpired, fmt.Errorf("%w: worker id %d: %v", ErrLeaseExpired, id, err))
		}
		return
	}
	wch := a.cli.Watch(ctx, key, clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-kac:
			if ok {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			fail(reasonLeaseExpired, fmt.Errorf("%w: lease %x of worker id %d", ErrLeaseExpired, int64(lease), id))
			return
		case wr, ok := <-wch:
			if ctx.Err() != nil {
				return
			}
			if !ok || wr.Err() != nil {
				// The watch is a second line of defence; the lease is the
				// claim. Re-establish it from our revision so no event is missed.
				a.log.Warn("worker id watch interrupted", zap.Int("worker_id", id), zap.Error(wr.Err()))
				wch = a.cli.Watch(ctx, key, clientv3.WithRev(rev+1))
				continue
			}
			for _, ev := range wr.Events {
				switch {
				case ev.Type == mvccpb.PUT && clientv3.LeaseID(ev.Kv.Lease) == lease && string(ev.Kv.Value) == a.cfg.Owner:
					rev = ev.Kv.ModRevision // our own write; nothing to do
				case ev.Type == mvccpb.DELETE:
					fail(reasonLeaseExpired, fmt.Errorf("%w: key %s of worker id %d was deleted", ErrLeaseExpired, key, id))
					return
				default:
					fail(reasonKeyStolen, fmt.Errorf("%w: key %s of worker id %d now holds %q", ErrKeyStolen, key, id, ev.Kv.Value))
					return
				}
			}
		}
	}
}

// Stop ends KeepAlive, waits for it, and revokes the lease, which deletes
// the key if it is still bound to our lease (never a key someone else now
// holds). Calling Stop again does nothing.
func (a *EtcdAllocator) Stop(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return nil
	}
	a.stopped = true
	if a.kaStop != nil {
		a.kaStop()
		<-a.kaDone
	}
	if a.key == "" {
		return nil
	}
	id, lease := a.id, a.lease
	a.key = ""
	if _, err := a.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// A lease that is already gone took the key with it.
		return fmt.Errorf("idgen: release worker id %d (revoke lease %x): %w", id, int64(lease), err)
	}
	a.log.Info("worker id released", zap.Int("worker_id", id))
	return nil
}
