package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// ServiceInfo describes one instance of a service.
type ServiceInfo struct {
	Name      string            `json:"name"`
	ID        string            `json:"id"`
	Addr      string            `json:"addr"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Version   string            `json:"version,omitempty"`
	StartedAt time.Time         `json:"started_at"`
}

// RegistryEventType says what a RegistryEvent reports.
type RegistryEventType int

// Registry event types.
const (
	// ServiceAdded: an instance appeared (or was there when the watch began).
	ServiceAdded RegistryEventType = iota + 1
	// ServiceUpdated: a registered instance changed its ServiceInfo.
	ServiceUpdated
	// ServiceRemoved: an instance unregistered or its lease expired.
	ServiceRemoved
)

func (t RegistryEventType) String() string {
	switch t {
	case ServiceAdded:
		return "added"
	case ServiceUpdated:
		return "updated"
	case ServiceRemoved:
		return "removed"
	}
	return fmt.Sprintf("RegistryEventType(%d)", int(t))
}

// RegistryEvent is one change seen by Registry.Watch. For ServiceRemoved,
// Service is the info last reported for the instance.
type RegistryEvent struct {
	Type    RegistryEventType
	Service ServiceInfo
}

// Registry registers this process's service instances and finds others'.
// Instance keys are services/<name>/<id>, bound to a lease.
type Registry struct{ p *Provider }

// registration is one Register'd instance and the goroutine that keeps it
// registered. Its fields are used under Provider.regMu, except sess and
// restore, which the keeper owns while it runs (halt waits for it).
type registration struct {
	p    *Provider
	info ServiceInfo
	ttl  time.Duration

	sess   *concurrency.Session // the lease the key is bound to
	cancel context.CancelFunc   // stops the keeper
	done   chan struct{}        // closed when the keeper has returned
	// restore makes the keeper write the key again on sess before it
	// waits: a replacement failed, and its put may have rebound the key to
	// a lease that is revoked or expires.
	restore bool
}

func serviceDir(name string) string { return dirServices + name + "/" }

func (reg *registration) key() string { return serviceDir(reg.info.Name) + reg.info.ID }

func checkSegment(what, s string) error {
	if s == "" || strings.Contains(s, "/") {
		return fmt.Errorf("coord: %s %q must be non-empty and contain no '/'", what, s)
	}
	return nil
}

// Register publishes info under a lease of ttl (0: Config.KeepAlive) that
// is kept alive in the background; if the lease is lost anyway (etcd
// unreachable for longer than ttl, or the lease revoked) the instance is
// registered again on a new lease as soon as etcd answers. Registering an ID
// again replaces its info (watchers see ServiceUpdated); if that fails, the
// instance stays registered with the info it had. A zero StartedAt is set
// to now.
func (r *Registry) Register(ctx context.Context, info ServiceInfo, ttl time.Duration) error {
	p := r.p
	if err := checkSegment("service name", info.Name); err != nil {
		return err
	}
	if err := checkSegment("service id", info.ID); err != nil {
		return err
	}
	ttl, err := p.ttlOrDefault(ttl)
	if err != nil {
		return err
	}
	if info.StartedAt.IsZero() {
		info.StartedAt = time.Now()
	}
	ctx, cancel := p.bind(ctx)
	defer cancel()

	p.regMu.Lock()
	defer p.regMu.Unlock()
	if p.isClosed() {
		return ErrClosed
	}
	old := p.regs[info.ID]
	if old != nil {
		// Its lease stays alive (the session keeps it); only re-registering
		// after a loss stops, so it cannot overwrite the new info.
		old.halt()
	}
	reg := &registration{p: p, info: info, ttl: ttl}
	if reg.sess, err = reg.put(ctx); err != nil {
		if old != nil {
			// A put whose answer was lost (a member died after the commit)
			// may have moved the key to the new lease, which put then
			// revoked, or which expires: the old registration must write
			// its key again.
			old.restore = true
			old.run()
		}
		return fmt.Errorf("coord: register %s/%s: %w", info.Name, info.ID, err)
	}
	p.regs[info.ID] = reg
	reg.run()
	if old != nil {
		// The key, if it is the same, is bound to the new lease now, so
		// revoking the old one only deletes a key under another name. If
		// the revoke fails, the old lease, no longer kept alive, expires
		// instead: the registration is made either way, so that is no
		// error of Register's.
		if err := old.release(ctx); err != nil {
			p.log.Warn("release the replaced registration's lease: it expires instead",
				zap.String("service", info.Name), zap.String("id", info.ID), zap.Error(err))
		}
	}
	return nil
}

// Update rewrites the info of an instance this Provider registered, on the
// lease it already has (watchers see ServiceUpdated); a later
// re-registration after a lost lease writes the updated info. info.ID names
// the instance; its Name must not change. ErrNotRegistered if the ID is not
// registered here.
func (r *Registry) Update(ctx context.Context, info ServiceInfo) error {
	p := r.p
	ctx, cancel := p.bind(ctx)
	defer cancel()
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if p.isClosed() {
		return ErrClosed
	}
	reg, ok := p.regs[info.ID]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotRegistered, info.ID)
	}
	if info.Name != reg.info.Name {
		return fmt.Errorf("coord: update %s: service name %q differs from the registered %q", info.ID, info.Name, reg.info.Name)
	}
	if info.StartedAt.IsZero() {
		info.StartedAt = reg.info.StartedAt
	}
	// The keeper reads info only when it registers again, under its own
	// goroutine: halt it, write, and let it go on with the new info.
	reg.halt()
	defer reg.run()
	val, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("coord: update %s/%s: encode: %w", info.Name, info.ID, err)
	}
	// Only while our lease still holds the key: after a loss the keeper
	// registers again with the new info.
	reg.info = info
	tr, err := p.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(reg.key()), "=", reg.sess.Lease())).
		Then(clientv3.OpPut(reg.key(), string(val), clientv3.WithLease(reg.sess.Lease()))).
		Commit()
	if err != nil {
		return fmt.Errorf("coord: update %s/%s: %w", info.Name, info.ID, err)
	}
	if !tr.Succeeded {
		p.log.Warn("update of a registration whose lease was lost: it is registered again with the new info",
			zap.String("service", info.Name), zap.String("id", info.ID))
	}
	return nil
}

// put writes the instance key on a new lease.
func (reg *registration) put(ctx context.Context) (*concurrency.Session, error) {
	p := reg.p
	val, err := json.Marshal(reg.info)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	sess, err := p.newSession(ctx, reg.ttl)
	if err != nil {
		return nil, err
	}
	if _, err := p.cli.Put(ctx, reg.key(), string(val), clientv3.WithLease(sess.Lease())); err != nil {
		_ = p.closeSession(ctx, sess)
		return nil, fmt.Errorf("put %s: %w", reg.key(), err)
	}
	return sess, nil
}

// run starts the keeper.
func (reg *registration) run() {
	ctx, cancel := context.WithCancel(reg.p.ctx)
	done := make(chan struct{})
	reg.cancel, reg.done = cancel, done
	if err := reg.p.spawn(func() { reg.keep(ctx, done) }); err != nil {
		close(done) // closing: Close stops and releases reg
	}
}

// keep registers the instance again each time its lease is lost, until ctx
// ends.
func (reg *registration) keep(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	p := reg.p
	if reg.restore && !reg.rewrite(ctx) {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reg.sess.Done():
		}
		if ctx.Err() != nil || p.cli.Ctx().Err() != nil {
			return // stopping, or the client is gone: nothing to keep
		}
		p.m.lost.WithLabelValues(kindRegistry).Inc()
		p.log.Error("registration lease lost: registering again", zap.String("service", reg.info.Name),
			zap.String("id", reg.info.ID), zap.Int64("lease", int64(reg.sess.Lease())))
		var retry backoff
		for {
			sess, err := reg.put(ctx)
			if err == nil {
				reg.sess = sess
				break
			}
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("register again failed: retrying", zap.String("service", reg.info.Name),
				zap.String("id", reg.info.ID), zap.Error(err))
			if !retry.wait(ctx) {
				return
			}
		}
	}
}

// rewrite writes the key again on the lease the registration holds,
// retrying until it succeeds or the lease is found gone (keep then
// registers again on a new one); false when ctx ended first.
func (reg *registration) rewrite(ctx context.Context) bool {
	p := reg.p
	val, err := json.Marshal(reg.info)
	if err != nil {
		return true // it was encoded when it was registered
	}
	var retry backoff
	for {
		_, err := p.cli.Put(ctx, reg.key(), string(val), clientv3.WithLease(reg.sess.Lease()))
		switch {
		case err == nil || isLeaseNotFound(err): // lost: keep registers again anyway
			reg.restore = false
			return true
		case ctx.Err() != nil:
			return false
		}
		p.log.Warn("restore registration after a failed replacement: retrying", zap.String("service", reg.info.Name),
			zap.String("id", reg.info.ID), zap.Error(err))
		if !retry.wait(ctx) {
			return false
		}
	}
}

// halt stops the keeper and waits for it; the lease stays alive.
func (reg *registration) halt() {
	reg.cancel()
	<-reg.done
}

// stop halts the keeper and revokes the lease.
func (reg *registration) stop(ctx context.Context) error {
	reg.halt()
	return reg.release(ctx)
}

// release revokes the lease, deleting the key if it is still bound to it.
func (reg *registration) release(ctx context.Context) error {
	if err := reg.p.closeSession(ctx, reg.sess); err != nil {
		return fmt.Errorf("coord: unregister %s/%s: %w", reg.info.Name, reg.info.ID, err)
	}
	return nil
}

// Unregister removes the instance this Provider registered under
// serviceID: its lease is revoked, which deletes the key. ErrNotRegistered
// if there is none.
func (r *Registry) Unregister(ctx context.Context, serviceID string) error {
	p := r.p
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if p.isClosed() {
		return ErrClosed
	}
	reg, ok := p.regs[serviceID]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotRegistered, serviceID)
	}
	delete(p.regs, serviceID)
	return reg.stop(ctx)
}

// Discover returns the registered instances of service name, by ID. An
// instance whose stored info is not valid JSON is logged and left out.
func (r *Registry) Discover(ctx context.Context, name string) ([]ServiceInfo, error) {
	if err := checkSegment("service name", name); err != nil {
		return nil, err
	}
	_, kvs, err := r.p.load(ctx, serviceDir(name), true)
	if err != nil {
		return nil, fmt.Errorf("coord: discover: %w", err)
	}
	out := make([]ServiceInfo, 0, len(kvs))
	for _, kv := range kvs {
		if info, ok := r.decode(kv); ok {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b ServiceInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (r *Registry) decode(kv *mvccpb.KeyValue) (ServiceInfo, bool) {
	var info ServiceInfo
	if err := json.Unmarshal(kv.Value, &info); err != nil {
		r.p.log.Warn("invalid service registration", zap.ByteString("key", kv.Key), zap.Error(err))
		return info, false
	}
	return info, true
}

// Watch reports the instances of service name: first a ServiceAdded for
// each instance registered now, then every change, in order and each once,
// across disconnects and leader changes (after a compaction, the difference
// between what was reported and what is there). The channel is closed when
// ctx ends or the Provider closes; the receiver must keep reading until
// then.
func (r *Registry) Watch(ctx context.Context, name string) (<-chan RegistryEvent, error) {
	p := r.p
	if err := checkSegment("service name", name); err != nil {
		return nil, err
	}
	if p.isClosed() {
		return nil, ErrClosed
	}
	dir := serviceDir(name)
	rev, kvs, err := p.load(ctx, dir, true)
	if err != nil {
		return nil, fmt.Errorf("coord: watch services: %w", err)
	}
	w := &serviceWatch{r: r, seen: make(map[string]reported), out: make(chan RegistryEvent)}
	f := follower{events: w.events, snapshot: w.snapshot}
	wctx, cancel := p.bind(ctx)
	err = p.spawn(func() {
		defer close(w.out)
		defer cancel()
		if w.snapshot(wctx, rev, kvs) {
			p.follow(wctx, dir, true, rev, f)
		}
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return w.out, nil
}

// serviceWatch turns the changes of a service's keys into RegistryEvents.
// Only the watch goroutine uses it.
type serviceWatch struct {
	r    *Registry
	seen map[string]reported // by key: what watchers were told
	// out is unbuffered: etcd's watch buffers while the receiver is busy.
	out chan RegistryEvent
}

type reported struct {
	info ServiceInfo
	raw  string
}

func (w *serviceWatch) events(ctx context.Context, evs []*clientv3.Event) bool {
	for _, ev := range evs {
		ok := true
		if ev.Type == mvccpb.DELETE {
			ok = w.remove(ctx, string(ev.Kv.Key))
		} else {
			ok = w.put(ctx, ev.Kv)
		}
		if !ok {
			return false
		}
	}
	return true
}

// snapshot reports the difference between what was reported and kvs.
func (w *serviceWatch) snapshot(ctx context.Context, _ int64, kvs []*mvccpb.KeyValue) bool {
	now := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		now[string(kv.Key)] = true
	}
	var gone []string
	for k := range w.seen {
		if !now[k] {
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	for _, k := range gone {
		if !w.remove(ctx, k) {
			return false
		}
	}
	for _, kv := range kvs {
		if !w.put(ctx, kv) {
			return false
		}
	}
	return true
}

func (w *serviceWatch) put(ctx context.Context, kv *mvccpb.KeyValue) bool {
	k := string(kv.Key)
	old, had := w.seen[k]
	if had && old.raw == string(kv.Value) {
		return true // the same info on a new lease: nothing changed for watchers
	}
	info, ok := w.r.decode(kv)
	if !ok {
		return true
	}
	w.seen[k] = reported{info: info, raw: string(kv.Value)}
	typ := ServiceAdded
	if had {
		typ = ServiceUpdated
	}
	return send(ctx, w.out, RegistryEvent{Type: typ, Service: info})
}

func (w *serviceWatch) remove(ctx context.Context, k string) bool {
	old, had := w.seen[k]
	if !had {
		return true // never reported (its info did not decode)
	}
	delete(w.seen, k)
	return send(ctx, w.out, RegistryEvent{Type: ServiceRemoved, Service: old.info})
}
