package idgen

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/coord"
)

// EtcdService is the coord instance-ID service whose IDs are kf-producer's
// Snowflake worker IDs: the keys are instance_ids/kf-producer/<id+1> under
// coord.namespace (coord counts from 1, worker IDs from 0).
const EtcdService = "kf-producer"

// EtcdAllocator is the etcd backend of Allocator. It is a user of coord's
// instance-ID allocator, the one implementation of lease-bound IDs on
// etcd: the lease is the Provider's (coord.keep_alive; idgen.allocator.ttl
// is the Redis backend's), the key holds Provider.Owner, and coord ends
// the ID when its lease expires or its key is deleted or rewritten by
// someone else.
type EtcdAllocator struct {
	alloc *coord.InstanceIDAllocator
	maxID int
	log   *zap.Logger
	m     *metrics

	mu      sync.Mutex
	held    *coord.AllocatedID // nil when none
	stopped bool
	kaStop  context.CancelFunc
	kaDone  chan struct{}
}

var _ Allocator = (*EtcdAllocator)(nil)

// NewEtcdAllocator returns an etcd-backed Allocator over p's instance IDs
// of EtcdService, cfg.MaxID of them. cfg.Prefix, cfg.TTL and cfg.Owner do
// not apply (p's namespace, keep-alive and owner do). Options: WithLogger,
// WithRegisterer.
func NewEtcdAllocator(p *coord.Provider, cfg AllocatorConfig, opts ...Option) (*EtcdAllocator, error) {
	if p == nil {
		return nil, errors.New("idgen: etcd allocator needs a coord provider")
	}
	o := buildOptions(opts)
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	alloc, err := p.InstanceIDAllocator(EtcdService, cfg.MaxID)
	if err != nil {
		return nil, fmt.Errorf("idgen: %w", err)
	}
	return &EtcdAllocator{alloc: alloc, maxID: cfg.MaxID, log: o.logger, m: m}, nil
}

// Allocate claims the lowest free worker ID. A second call returns the ID
// already held. coord keeps the lease alive from here on; KeepAlive reports
// its loss.
func (a *EtcdAllocator) Allocate(ctx context.Context) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return 0, ErrStopped
	}
	if a.held != nil && a.held.Err() == nil {
		return a.held.ID() - 1, nil
	}
	id, err := a.alloc.AcquireID(ctx)
	if errors.Is(err, coord.ErrNoFreeID) {
		return 0, noFreeID(a.maxID, "instance_ids/"+EtcdService+"/")
	}
	if err != nil {
		return 0, fmt.Errorf("idgen: claim worker id: %w", err)
	}
	a.held, a.kaDone = id, nil
	a.log.Info("worker id allocated", zap.Int("worker_id", id.ID()-1), zap.String("key", id.Key()))
	return id.ID() - 1, nil
}

// ID returns the held worker ID, if any.
func (a *EtcdAllocator) ID() (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == nil {
		return 0, false
	}
	return a.held.ID() - 1, true
}

// KeepAlive reports the end of the held ID: ErrLeaseExpired when its lease
// expired, ErrKeyStolen when its key was deleted or rewritten by someone
// else; either closes the channel. (coord renews the lease itself.)
func (a *EtcdAllocator) KeepAlive(ctx context.Context) <-chan error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopped:
		return closedErr(ErrStopped)
	case a.held == nil:
		return closedErr(ErrNotAllocated)
	case a.kaDone != nil:
		return closedErr(errors.New("idgen: keepalive already running"))
	}
	errc := make(chan error, 1)
	kctx, cancel := context.WithCancel(ctx)
	a.kaStop, a.kaDone = cancel, make(chan struct{})
	go a.watch(kctx, a.held, errc, a.kaDone)
	return errc
}

func (a *EtcdAllocator) watch(ctx context.Context, id *coord.AllocatedID, errc chan<- error, done chan<- struct{}) {
	defer close(done)
	defer close(errc)
	select {
	case <-ctx.Done():
		return
	case <-id.Done():
	}
	switch err := id.Err(); {
	case errors.Is(err, coord.ErrIDTaken):
		a.m.errors.WithLabelValues(reasonKeyStolen).Inc()
		sendFatal(ctx, errc, fmt.Errorf("%w: worker id %d: %v", ErrKeyStolen, id.ID()-1, err))
	case err != nil:
		a.m.errors.WithLabelValues(reasonLeaseExpired).Inc()
		sendFatal(ctx, errc, fmt.Errorf("%w: worker id %d: %v", ErrLeaseExpired, id.ID()-1, err))
	}
}

// Stop ends KeepAlive, waits for it, and frees the ID (its key is deleted
// if still ours). Calling Stop again does nothing.
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
	if a.held == nil {
		return nil
	}
	id := a.held
	a.held = nil
	if err := id.Close(ctx); err != nil {
		return fmt.Errorf("idgen: release worker id %d: %w", id.ID()-1, err)
	}
	a.log.Info("worker id released", zap.Int("worker_id", id.ID()-1))
	return nil
}
