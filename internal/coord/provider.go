package coord

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.uber.org/zap"
)

// Key directories under Config.Namespace.
const (
	dirServices    = "services/"
	dirConfig      = "config/"
	dirLocks       = "locks/"
	dirInstanceIDs = "instance_ids/"
)

// Provider is the entry point of the package: it owns the etcd client and
// everything held through it. It is safe for concurrent use.
type Provider struct {
	cfg   Config
	cli   *clientv3.Client // its KV, Watcher and Lease are confined to cfg.Namespace
	log   *zap.Logger
	m     *metrics
	owner string // value of instance-ID keys: who holds the ID

	// ctx is cancelled by Close: it ends every goroutine the Provider
	// started (counted in wg) and aborts pending acquisitions.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	locks  map[*Lock]struct{} // held
	allocs map[string]*InstanceIDAllocator

	// regMu serialises Register, Unregister and Close's release of
	// registrations: replacing a registration must stop its keeper before
	// the new key is written, or the keeper could re-write the old info.
	regMu sync.Mutex
	regs  map[string]*registration // by service ID

	registry *Registry
	config   *ConfigCenter
}

// New validates cfg, connects to etcd and checks that it answers within
// cfg.DialTimeout (and ctx), so a wrong endpoint fails at start.
func New(ctx context.Context, cfg Config, opts ...Option) (*Provider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = zap.NewNop()
	}
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	tc, err := cfg.TLSClientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		TLS:         tc,
		Logger:      o.logger.Named("etcd"),
	})
	if err != nil {
		return nil, fmt.Errorf("coord: etcd client for %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	// The namespace wrappers also confine the concurrency package (locks)
	// and watches, so no code below spells the namespace out.
	cli.KV = namespace.NewKV(cli.KV, cfg.Namespace)
	cli.Watcher = namespace.NewWatcher(cli.Watcher, cfg.Namespace)
	cli.Lease = namespace.NewLease(cli.Lease, cfg.Namespace)

	// clientv3.New does not wait for a connection.
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	_, err = cli.Get(pctx, dirConfig, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("coord: reach etcd at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}

	host, _ := os.Hostname()
	p := &Provider{
		cfg:    cfg,
		cli:    cli,
		log:    o.logger,
		m:      m,
		owner:  host + "/" + strconv.Itoa(os.Getpid()),
		regs:   make(map[string]*registration),
		locks:  make(map[*Lock]struct{}),
		allocs: make(map[string]*InstanceIDAllocator),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.registry = &Registry{p: p}
	p.config = &ConfigCenter{p: p}
	return p, nil
}

// Registry returns the service registry.
func (p *Provider) Registry() *Registry { return p.registry }

// Ping reads from etcd (a count of the config keys): nil when etcd answers
// within ctx.
func (p *Provider) Ping(ctx context.Context) error {
	_, err := p.cli.Get(ctx, dirConfig, clientv3.WithCountOnly())
	return err
}

// Owner is the value this Provider writes into the keys of the instance
// IDs it holds: who holds them.
func (p *Provider) Owner() string { return p.owner }

// Config returns the config center.
func (p *Provider) Config() *ConfigCenter { return p.config }

// Close releases everything the Provider holds — instance IDs, locks and
// registrations, whose keys etcd deletes with their revoked leases — ends
// every watch (their channels close) and goroutine it started, and closes
// the etcd client. Calling Close again does nothing.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	locks, allocs := p.locks, p.allocs
	p.locks, p.allocs = nil, nil
	p.mu.Unlock()
	p.cancel() // also aborts a Register in flight, so regMu is free soon
	p.regMu.Lock()
	regs := p.regs
	p.regs = nil
	p.regMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	var errs []error
	for _, r := range regs {
		errs = append(errs, r.stop(ctx))
	}
	for l := range locks {
		errs = append(errs, l.release(ctx))
	}
	for _, a := range allocs {
		errs = append(errs, a.close(ctx))
	}
	p.wg.Wait()
	if err := p.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, fmt.Errorf("coord: close etcd client: %w", err))
	}
	return errors.Join(errs...)
}

// spawn runs f in a goroutine that Close waits for; f must return once
// p.ctx is done.
func (p *Provider) spawn(f func()) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return nil
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// bind returns a context that ends with ctx or with the Provider.
func (p *Provider) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(p.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// isClosed reports whether Close has started.
func (p *Provider) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// ttlOrDefault maps ttl 0 to Config.KeepAlive and rejects negative ones.
func (p *Provider) ttlOrDefault(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("coord: ttl must be >= 0, got %s", ttl)
	case ttl == 0:
		return p.cfg.KeepAlive, nil
	}
	return ttl, nil
}

// leaseSeconds rounds ttl up to whole seconds, at least one.
func leaseSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// newSession grants a lease of ttl under ctx and keeps it alive until the
// session is closed (which revokes it) or the client is closed. The grant is
// done here rather than by concurrency.NewSession so that ctx bounds it
// without also bounding the keep-alive.
func (p *Provider) newSession(ctx context.Context, ttl time.Duration) (*concurrency.Session, error) {
	secs := leaseSeconds(ttl)
	lease, err := p.cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	s, err := concurrency.NewSession(p.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(secs)))
	if err != nil {
		p.revoke(lease.ID)
		return nil, fmt.Errorf("keep lease %x alive: %w", int64(lease.ID), err)
	}
	return s, nil
}

// revoke drops a lease nobody will use; failure only delays its expiry.
func (p *Provider) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	if _, err := p.cli.Revoke(ctx, id); err != nil {
		p.log.Warn("revoke unused lease", zap.Int64("lease", int64(id)), zap.Error(err))
	}
}

// closeSession stops keeping s alive and revokes its lease, deleting every
// key bound to it. A lease that is already gone is no error: its keys went
// with it.
func (p *Provider) closeSession(ctx context.Context, s *concurrency.Session) error {
	s.Orphan()
	if _, err := p.cli.Revoke(ctx, s.Lease()); err != nil && !isLeaseNotFound(err) {
		return fmt.Errorf("revoke lease %x: %w", int64(s.Lease()), err)
	}
	return nil
}

// leaseLoss reports the loss of one lease — counted and logged once,
// whoever notices it first.
type leaseLoss struct {
	p    *Provider
	kind string
	once sync.Once
}

func (p *Provider) newLeaseLoss(kind string) *leaseLoss { return &leaseLoss{p: p, kind: kind} }

func (l *leaseLoss) report(s *concurrency.Session) {
	l.once.Do(func() {
		l.p.m.lost.WithLabelValues(l.kind).Inc()
		l.p.log.Error("lease lost", zap.String("kind", l.kind), zap.Int64("lease", int64(s.Lease())))
	})
}

// monitor reports the loss of s (its lease expired or was revoked) unless
// stop is closed or the Provider closes first; then it runs lost, if set.
func (p *Provider) monitor(loss *leaseLoss, s *concurrency.Session, stop <-chan struct{}, lost func()) error {
	return p.spawn(func() {
		select {
		case <-s.Done():
		case <-stop:
			return
		case <-p.ctx.Done():
			return
		}
		if isDone(stop) || p.ctx.Err() != nil || p.cli.Ctx().Err() != nil {
			return // released on purpose, or closing
		}
		loss.report(s)
		if lost != nil {
			lost()
		}
	})
}

func isLeaseNotFound(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
