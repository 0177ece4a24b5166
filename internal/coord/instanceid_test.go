package coord

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const gateway = "im-gateway"

func allocator(t *testing.T, p *Provider, maxID int) *InstanceIDAllocator {
	t.Helper()
	a, err := p.InstanceIDAllocator(gateway, maxID)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func acquire(t *testing.T, a *InstanceIDAllocator) *AllocatedID {
	t.Helper()
	id, err := a.AcquireID(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// heldIDs returns the IDs whose keys exist, failing if one has no live
// lease.
func heldIDs(t *testing.T, raw *clientv3.Client, ns string) []string {
	t.Helper()
	dir := ns + dirInstanceIDs + gateway + "/"
	resp, err := raw.Get(t.Context(), dir, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, kv := range resp.Kvs {
		ttl, err := raw.TimeToLive(t.Context(), clientv3.LeaseID(kv.Lease))
		if kv.Lease == 0 || err != nil || ttl.TTL <= 0 {
			t.Fatalf("key %s: lease %x, ttl %+v, %v; want a live lease", kv.Key, kv.Lease, ttl, err)
		}
		ids = append(ids, string(kv.Key[len(dir):]))
	}
	return ids
}

// Seed 000, acceptance 1 and 2: instances starting together each get a
// unique ID in [1, 1023], held by a key with a lease.
func TestInstanceIDsUniqueAcrossConcurrentAllocators(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	const n = 20
	ps := make([]*Provider, n)
	for i := range ps {
		ps[i] = newProvider(t, ns)
	}
	ids := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, err := p.InstanceIDAllocator(gateway, 1023)
			if err != nil {
				errs[i] = err
				return
			}
			id, err := a.AcquireID(t.Context())
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = id.ID()
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	seen := make(map[int]bool)
	for _, id := range ids {
		if id < 1 || id > 1023 || seen[id] {
			t.Fatalf("ids %v: %d out of range or repeated", ids, id)
		}
		seen[id] = true
	}
	// The lowest free IDs are taken: 1..n.
	if slices.Sort(ids); ids[0] != 1 || ids[n-1] != n {
		t.Fatalf("ids = %v, want 1..%d", ids, n)
	}
	if held := heldIDs(t, raw, ns); len(held) != n {
		t.Fatalf("keys = %v, want %d", held, n)
	}

	// Reentrant per service: the same allocator, which refuses another
	// bound.
	a := allocator(t, ps[0], 1023)
	if b := allocator(t, ps[0], 1023); a != b {
		t.Fatal("InstanceIDAllocator returned a second allocator for the same service")
	}
	if _, err := ps[0].InstanceIDAllocator(gateway, 7); err == nil {
		t.Fatal("InstanceIDAllocator accepted a different maxID for the same service")
	}
}

// Acceptance 3 and 5: Close deletes the key at once, and a freed ID is
// reused — also after every instance has shut down.
func TestInstanceIDCloseReleasesAndIsReused(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	a := allocator(t, p, 3)
	one, two, three := acquire(t, a), acquire(t, a), acquire(t, a)
	if one.ID() != 1 || two.ID() != 2 || three.ID() != 3 {
		t.Fatalf("ids = %d %d %d", one.ID(), two.ID(), three.ID())
	}
	if _, err := a.AcquireID(t.Context()); !errors.Is(err, ErrNoFreeID) {
		t.Fatalf("AcquireID with every id held: %v, want ErrNoFreeID", err)
	}
	if err := two.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := two.Close(t.Context()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-two.Done():
	default:
		t.Fatal("Done not closed by Close")
	}
	if held := heldIDs(t, raw, ns); !slices.Equal(held, []string{"1", "3"}) {
		t.Fatalf("keys after closing 2 = %v", held)
	}
	if again := acquire(t, a); again.ID() != 2 {
		t.Fatalf("after closing 2, got %d", again.ID())
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if held := heldIDs(t, raw, ns); len(held) != 0 {
		t.Fatalf("keys after Provider.Close = %v", held)
	}
	if next := acquire(t, allocator(t, newProvider(t, ns), 3)); next.ID() != 1 {
		t.Fatalf("after every instance shut down, got %d, want 1 again", next.ID())
	}
}

// Acceptance 4: the ID of an instance killed without cleanup frees when its
// lease expires, and is reused.
func TestInstanceIDFreedWhenHolderDies(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	victim := newProvider(t, ns, keepAlive(2*time.Second))
	survivor := newProvider(t, ns)
	dead := acquire(t, allocator(t, victim, 1023))
	alive := allocator(t, survivor, 1023)
	if id := acquire(t, alive).ID(); dead.ID() != 1 || id != 2 {
		t.Fatalf("ids = %d, %d; want 1, 2", dead.ID(), id)
	}

	wch := raw.Watch(t.Context(), ns+dead.Key())
	kill(t, victim)
	select {
	case wr := <-wch:
		if len(wr.Events) != 1 || wr.Events[0].Type != clientv3.EventTypeDelete {
			t.Fatalf("watch of the dead instance's key: %+v", wr)
		}
	case <-time.After(wait):
		t.Fatalf("key of the killed instance still there after %s", wait)
	}
	if id := acquire(t, alive).ID(); id != 1 {
		t.Fatalf("after the holder died, got %d, want its id 1", id)
	}
}

// An ID whose lease is lost while its process lives is reported on Done
// (another instance may take it), and AcquireID carries on with a new
// lease.
func TestInstanceIDLostLeaseEndsID(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns, keepAlive(3*time.Second))
	a := allocator(t, p, 1023)
	id := acquire(t, a)
	resp, err := raw.Get(t.Context(), ns+id.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key %s: %v %v", id.Key(), resp, err)
	}
	if _, err := raw.Revoke(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-id.Done():
	case <-time.After(wait):
		t.Fatal("Done not closed after the lease was lost")
	}
	if n := testenv.MetricValue(p.m.lost.WithLabelValues(kindInstanceID)); n != 1 {
		t.Fatalf("instance-id lease losses = %v, want 1", n)
	}
	if again := acquire(t, a); again.ID() != 1 {
		t.Fatalf("AcquireID after the loss = %d, want 1", again.ID())
	}
	if held := heldIDs(t, raw, ns); !slices.Equal(held, []string{"1"}) {
		t.Fatalf("keys = %v", held)
	}
}

// An ID whose key someone else rewrites while it is held ends with
// ErrIDTaken, and Close leaves the other writer's key alone.
func TestInstanceIDTakenEndsID(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	id := acquire(t, allocator(t, p, 1023))
	if _, err := raw.Put(t.Context(), ns+id.Key(), "intruder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-id.Done():
	case <-time.After(wait):
		t.Fatal("Done not closed after the key was rewritten")
	}
	if !errors.Is(id.Err(), ErrIDTaken) {
		t.Fatalf("Err = %v, want ErrIDTaken", id.Err())
	}
	if err := id.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, err := raw.Get(t.Context(), ns+id.Key())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "intruder" {
		t.Fatalf("after Close the taken key is %v (%v), want the intruder's value", resp.Kvs, err)
	}
}
