package coord

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func expectService(t *testing.T, ch <-chan RegistryEvent, typ RegistryEventType, id, addr string) ServiceInfo {
	t.Helper()
	e := recv(t, ch)
	if e.Type != typ || e.Service.ID != id || (addr != "" && e.Service.Addr != addr) {
		t.Fatalf("registry event = %v %+v, want %v %s %s", e.Type, e.Service, typ, id, addr)
	}
	return e.Service
}

func discoverIDs(t *testing.T, r *Registry, name string) []string {
	t.Helper()
	infos, err := r.Discover(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(infos))
	for i, in := range infos {
		ids[i] = in.ID
	}
	return ids
}

func TestRegistryRegisterDiscoverWatch(t *testing.T) {
	_, ns := testenv.Etcd(t)
	watcher, svc := newProvider(t, ns), newProvider(t, ns)
	ctx := t.Context()

	a := ServiceInfo{Name: "consumer", ID: "a", Addr: "10.0.0.1:9000", Metadata: map[string]string{"zone": "x"}, Version: "1.0"}
	if err := svc.Registry().Register(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Registry().Watch(ctx, "consumer")
	if err != nil {
		t.Fatal(err)
	}
	got := expectService(t, ch, ServiceAdded, "a", a.Addr) // registered before the watch
	if got.Metadata["zone"] != "x" || got.Version != "1.0" || got.StartedAt.IsZero() {
		t.Fatalf("watched info = %+v", got)
	}

	b := ServiceInfo{Name: "consumer", ID: "b", Addr: "10.0.0.2:9000"}
	if err := svc.Registry().Register(ctx, b, 0); err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "b", b.Addr)
	if ids := discoverIDs(t, watcher.Registry(), "consumer"); len(ids) != 2 || ids[0] != "a" || ids[1] != "b" {
		t.Fatalf("Discover = %v, want [a b]", ids)
	}

	a.Addr = "10.0.0.1:9001"
	if err := svc.Registry().Register(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceUpdated, "a", a.Addr)

	if err := svc.Registry().Unregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceRemoved, "a", a.Addr)
	if ids := discoverIDs(t, watcher.Registry(), "consumer"); len(ids) != 1 || ids[0] != "b" {
		t.Fatalf("Discover after Unregister = %v, want [b]", ids)
	}
	if err := svc.Registry().Unregister(ctx, "a"); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("second Unregister: %v, want ErrNotRegistered", err)
	}
	if ids := discoverIDs(t, watcher.Registry(), "other"); len(ids) != 0 {
		t.Fatalf("Discover of another service = %v", ids)
	}
}

// An instance whose process dies (nothing renews its lease, nothing
// revokes it) is removed when the lease expires.
func TestRegistryRemovesInstanceWhenLeaseExpires(t *testing.T) {
	_, ns := testenv.Etcd(t)
	watcher := newProvider(t, ns)
	victim := newProvider(t, ns, keepAlive(2*time.Second))
	ctx := t.Context()

	if err := victim.Registry().Register(ctx, ServiceInfo{Name: "gw", ID: "v", Addr: "h:1"}, 0); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Registry().Watch(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "v", "h:1")
	killed := time.Now()
	kill(t, victim)
	expectService(t, ch, ServiceRemoved, "v", "h:1")
	if d := time.Since(killed); d < time.Second {
		t.Fatalf("removed %s after the kill: before the lease could expire", d)
	}
	if ids := discoverIDs(t, watcher.Registry(), "gw"); len(ids) != 0 {
		t.Fatalf("Discover after expiry = %v", ids)
	}
}

// A registration whose lease is lost while its process lives registers
// again on a new lease.
func TestRegistryRegistersAgainAfterLeaseLoss(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	ctx := t.Context()

	// A short TTL: the keep-alive that learns of the loss runs every TTL/3.
	if err := p.Registry().Register(ctx, ServiceInfo{Name: "gw", ID: "x", Addr: "h:2"}, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	ch, err := p.Registry().Watch(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "x", "h:2")

	key := ns + dirServices + "gw/x"
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("registration key %s: %v %+v, want one key with a lease", key, err, resp)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := raw.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceRemoved, "x", "h:2")
	expectService(t, ch, ServiceAdded, "x", "h:2")
	resp, err = raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) == lease {
		t.Fatalf("registration after the loss: %v %+v, want a key on a new lease", err, resp)
	}
	if n := testenv.MetricValue(p.m.lost.WithLabelValues(kindRegistry)); n != 1 {
		t.Fatalf("registry lease losses = %v, want 1", n)
	}
}

// A registry watch whose resume revision was compacted away reports the
// difference between what it had reported and what is registered now.
func TestRegistryWatchCompactedReportsDifference(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	watcher, svc := newProvider(t, ns), newProvider(t, ns)
	cw := interceptWatches(t, watcher)
	ctx := t.Context()
	reg := func(id, addr string) {
		t.Helper()
		if err := svc.Registry().Register(ctx, ServiceInfo{Name: "gw", ID: id, Addr: addr}, 0); err != nil {
			t.Fatal(err)
		}
	}
	reg("a", "h:1")
	reg("b", "h:2")
	ch, err := watcher.Registry().Watch(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "a", "h:1")
	expectService(t, ch, ServiceAdded, "b", "h:2")

	release := cw.cut()
	cw.awaitRewatch(t)
	if err := svc.Registry().Unregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	reg("b", "h:3")
	reg("c", "h:4")
	resp, err := raw.Get(ctx, ns+"any")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	release()
	expectService(t, ch, ServiceRemoved, "a", "h:1")
	expectService(t, ch, ServiceUpdated, "b", "h:3")
	expectService(t, ch, ServiceAdded, "c", "h:4")
	reg("d", "h:5")
	expectService(t, ch, ServiceAdded, "d", "h:5")
}

// Update rewrites a registered instance's info on the lease it has: the
// watchers see ServiceUpdated with the new info, the lease (and so the
// registration's lifetime) is unchanged, and an unknown ID is refused.
func TestRegistryUpdateKeepsTheLease(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	watcher, svc := newProvider(t, ns), newProvider(t, ns)
	ctx := t.Context()
	info := ServiceInfo{Name: "consumer", ID: "a", Addr: "10.0.0.1:9000", Metadata: map[string]string{"partitions": "0,1"}}
	if err := svc.Registry().Register(ctx, info, 0); err != nil {
		t.Fatal(err)
	}
	leaseOf := func() int64 {
		t.Helper()
		resp, err := raw.Get(ctx, ns+serviceDir("consumer")+"a")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("instance key: %v %v", resp, err)
		}
		return resp.Kvs[0].Lease
	}
	lease := leaseOf()
	ch, err := watcher.Registry().Watch(ctx, "consumer")
	if err != nil {
		t.Fatal(err)
	}
	started := expectService(t, ch, ServiceAdded, "a", info.Addr).StartedAt

	info.Metadata = map[string]string{"partitions": "2"}
	if err := svc.Registry().Update(ctx, info); err != nil {
		t.Fatal(err)
	}
	got := expectService(t, ch, ServiceUpdated, "a", info.Addr)
	if got.Metadata["partitions"] != "2" || !got.StartedAt.Equal(started) {
		t.Fatalf("updated info = %+v, want partitions 2 and the first start time %s", got, started)
	}
	if l := leaseOf(); l != lease {
		t.Fatalf("lease after Update = %x, want the registration's %x", l, lease)
	}
	if err := svc.Registry().Update(ctx, ServiceInfo{Name: "consumer", ID: "nope"}); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Update of an unregistered ID: %v, want ErrNotRegistered", err)
	}
	if err := svc.Registry().Update(ctx, ServiceInfo{Name: "producer", ID: "a"}); err == nil {
		t.Fatal("Update that renames the service accepted")
	}
}

// lostReplyKV makes the next Put, once armed, report a failure after etcd
// applied it — as when the member that answers dies between the commit and
// the answer (an etcd leader killed under load).
type lostReplyKV struct {
	clientv3.KV
	lose atomic.Bool
}

func (k *lostReplyKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	resp, err := k.KV.Put(ctx, key, val, opts...)
	if err == nil && k.lose.CompareAndSwap(true, false) {
		return nil, errors.New("connection lost before the answer")
	}
	return resp, err
}

// A replacement whose put was applied but reported failed leaves the
// instance registered with the info it had. The put moved the key to the
// new lease, which Register then revoked: the old registration, which
// still holds its own lease, must write its key again (it used to wait for
// the loss of that lease, which never came, and the instance stayed gone).
func TestRegistryFailedReplacementKeepsTheRegistration(t *testing.T) {
	_, ns := testenv.Etcd(t)
	watcher, svc := newProvider(t, ns), newProvider(t, ns)
	kv := &lostReplyKV{KV: svc.cli.KV}
	svc.cli.KV = kv
	ctx := t.Context()

	a := ServiceInfo{Name: "gw", ID: "a", Addr: "h:1"}
	if err := svc.Registry().Register(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Registry().Watch(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "a", "h:1")

	b := a
	b.Addr = "h:2"
	kv.lose.Store(true)
	if err := svc.Registry().Register(ctx, b, 0); err == nil {
		t.Fatal("Register whose put answer was lost returned nil")
	}
	expectService(t, ch, ServiceUpdated, "a", "h:2") // the put that was applied
	expectService(t, ch, ServiceRemoved, "a", "h:2") // its lease revoked
	expectService(t, ch, ServiceAdded, "a", "h:1")   // the registration restored
	infos, err := watcher.Registry().Discover(ctx, "gw")
	if err != nil || len(infos) != 1 || infos[0].Addr != "h:1" {
		t.Fatalf("Discover = %+v, %v; want a at h:1", infos, err)
	}
}

// failRevokeLease fails the next Revoke, once armed, as an unreachable
// etcd would.
type failRevokeLease struct {
	clientv3.Lease
	fail atomic.Bool
}

func (l *failRevokeLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	if l.fail.CompareAndSwap(true, false) {
		return nil, errors.New("etcd unreachable")
	}
	return l.Lease.Revoke(ctx, id)
}

// A replacement that is made but cannot revoke the replaced lease succeeds:
// the key is bound to the new lease, and the old one, no longer kept
// alive, expires without taking the key along (Register used to return
// the revoke's error, so a caller took the new info for not registered).
func TestRegistryReplacementMadeDespiteFailedRevoke(t *testing.T) {
	_, ns := testenv.Etcd(t)
	watcher, svc := newProvider(t, ns), newProvider(t, ns)
	lease := &failRevokeLease{Lease: svc.cli.Lease}
	svc.cli.Lease = lease
	ctx := t.Context()
	const ttl = 2 * time.Second

	a := ServiceInfo{Name: "gw", ID: "a", Addr: "h:1"}
	if err := svc.Registry().Register(ctx, a, ttl); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Registry().Watch(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, ch, ServiceAdded, "a", "h:1")
	b := a
	b.Addr = "h:2"
	lease.fail.Store(true)
	if err := svc.Registry().Register(ctx, b, ttl); err != nil {
		t.Fatalf("Register that replaced the info but could not revoke the old lease: %v", err)
	}
	if lease.fail.Load() {
		t.Fatal("the replaced lease was not revoked at all")
	}
	expectService(t, ch, ServiceUpdated, "a", "h:2")
	// Past the old lease's expiry, nothing else happened.
	select {
	case e := <-ch:
		t.Fatalf("after the old lease expired: %v %+v", e.Type, e.Service)
	case <-time.After(2 * ttl):
	}
	infos, err := watcher.Registry().Discover(ctx, "gw")
	if err != nil || len(infos) != 1 || infos[0].Addr != "h:2" {
		t.Fatalf("Discover = %+v, %v; want a at h:2", infos, err)
	}
}
