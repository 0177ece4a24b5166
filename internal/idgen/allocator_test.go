package idgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// allocBackend lets one acceptance suite run against every Allocator
// backend on the real service.
type allocBackend struct {
	// ttl is the shortest TTL the backend honours (etcd rounds leases up to
	// its minimum, about 2 s on a default single-node server).
	ttl time.Duration
	// newAlloc builds an allocator over this test's key space.
	newAlloc func(t *testing.T, maxID int, ttl time.Duration) Allocator
	// holder reads the owner stored for id; ok is false when the key is gone.
	holder func(t *testing.T, id int) (owner string, ok bool)
	// checkBound asserts the key of id expires with its holder (TTL or lease).
	checkBound func(t *testing.T, id int, ttl time.Duration)
	// steal overwrites the key of id as another owner would.
	steal func(t *testing.T, id int, owner string)
	// leaseOutlivesKeepAlive: the claim is renewed by something other
	// than KeepAlive, so cancelling KeepAlive is no crash.
	leaseOutlivesKeepAlive bool
}

func redisBackend(t *testing.T) allocBackend {
	client, prefix := testenv.Redis(t)
	key := func(id int) string { return prefix + "idgen:worker:" + strconv.Itoa(id) }
	return allocBackend{
		ttl: time.Second,
		newAlloc: func(t *testing.T, maxID int, ttl time.Duration) Allocator {
			a, err := NewRedisAllocator(client, AllocatorConfig{Prefix: prefix, MaxID: maxID, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		holder: func(t *testing.T, id int) (string, bool) {
			v, err := client.Get(context.Background(), key(id)).Result()
			if errors.Is(err, redis.Nil) {
				return "", false
			}
			if err != nil {
				t.Fatal(err)
			}
			return v, true
		},
		checkBound: func(t *testing.T, id int, ttl time.Duration) {
			pttl, err := client.PTTL(context.Background(), key(id)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if pttl <= 0 || pttl > ttl {
				t.Fatalf("PTTL of %s = %s, want in (0, %s]", key(id), pttl, ttl)
			}
		},
		steal: func(t *testing.T, id int, owner string) {
			if err := client.Set(context.Background(), key(id), owner, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func etcdBackend(t *testing.T) allocBackend {
	cli, ns := testenv.Etcd(t)
	key := func(id int) string { return ns + "instance_ids/" + EtcdService + "/" + strconv.Itoa(id+1) }
	get := func(t *testing.T, id int) *clientv3.GetResponse {
		resp, err := cli.Get(context.Background(), key(id))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	return allocBackend{
		ttl: 2 * time.Second, // the default server's minimum lease TTL
		// Each allocator is another process: its own Provider, lease and
		// owner, the lease's TTL being the provider's keep-alive.
		newAlloc: func(t *testing.T, maxID int, ttl time.Duration) Allocator {
			p := coordtest.Provider(t, ns, func(c *coord.Config) { c.KeepAlive = ttl })
			a, err := NewEtcdAllocator(p, AllocatorConfig{MaxID: maxID, Owner: p.Owner()})
			if err != nil {
				t.Fatal(err)
			}
			owners.Store(a, p.Owner())
			return a
		},
		// coord keeps the lease alive, not KeepAlive: a crash is a process
		// that stops, tested where the lease lives
		// (coord.TestInstanceIDFreedWhenHolderDies).
		leaseOutlivesKeepAlive: true,
		holder: func(t *testing.T, id int) (string, bool) {
			resp := get(t, id)
			if len(resp.Kvs) == 0 {
				return "", false
			}
			return string(resp.Kvs[0].Value), true
		},
		checkBound: func(t *testing.T, id int, ttl time.Duration) {
			resp := get(t, id)
			if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
				t.Fatalf("key %s = %v, want one key bound to a lease", key(id), resp.Kvs)
			}
			lease := clientv3.LeaseID(resp.Kvs[0].Lease)
			ttlResp, err := cli.TimeToLive(context.Background(), lease, clientv3.WithAttachedKeys())
			if err != nil {
				t.Fatal(err)
			}
			if ttlResp.TTL <= 0 || !slices.ContainsFunc(ttlResp.Keys, func(k []byte) bool { return string(k) == key(id) }) {
				t.Fatalf("lease %x: TTL %d keys %q, want a live lease holding %s", int64(lease), ttlResp.TTL, ttlResp.Keys, key(id))
			}
			// etcd may raise the TTL to its minimum (about 2 s by default).
			if granted := time.Duration(ttlResp.GrantedTTL) * time.Second; granted < ttl || granted > max(ttl, 5*time.Second) {
				t.Fatalf("lease granted TTL %s, want about %s", granted, ttl)
			}
		},
		steal: func(t *testing.T, id int, owner string) {
			if _, err := cli.Put(context.Background(), key(id), owner); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// owners maps an etcd allocator to its provider's owner (ownerOf).
var owners sync.Map

func TestAllocator(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) allocBackend{"redis": redisBackend, "etcd": etcdBackend} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runAllocatorSuite(t, mk)
		})
	}
}

func stopAtCleanup(t *testing.T, a Allocator) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(ctx) // tests that care call Stop themselves
	})
}

func runAllocatorSuite(t *testing.T, mk func(*testing.T) allocBackend) {
	ctx := context.Background()

	t.Run("concurrent allocators get distinct ids, then the pool is exhausted", func(t *testing.T) {
		t.Parallel()
		b := mk(t)
		const n = 20
		ids := make([]int, n)
		errs := make([]error, n)
		allocs := make([]Allocator, n)
		var wg sync.WaitGroup
		for i := range n {
			allocs[i] = b.newAlloc(t, n, time.Minute)
			stopAtCleanup(t, allocs[i])
			wg.Go(func() { ids[i], errs[i] = allocs[i].Allocate(ctx) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("allocator %d: %v", i, err)
			}
		}
		sorted := slices.Sorted(slices.Values(ids))
		for i, id := range sorted {
			if id != i {
				t.Fatalf("ids %v, want each of 0..%d exactly once", sorted, n-1)
			}
		}
		for i, id := range ids {
			owner, ok := b.holder(t, id)
			if !ok || owner != ownerOf(allocs[i]) {
				t.Fatalf("key of id %d holds %q (present %v), want owner %q", id, owner, ok, ownerOf(allocs[i]))
			}
			b.checkBound(t, id, time.Minute)
		}
		_, err := b.newAlloc(t, n, time.Minute).Allocate(ctx)
		if !errors.Is(err, ErrNoFreeID) || !strings.Contains(err.Error(), "all 20 worker ids") {
			t.Fatalf("21st Allocate error = %v, want ErrNoFreeID stating the pool size 20", err)
		}
	})

	t.Run("Stop deletes the key and the id is reused", func(t *testing.T) {
		t.Parallel()
		b := mk(t)
		const n = 3
		allocs := make([]Allocator, n)
		for i := range n {
			allocs[i] = b.newAlloc(t, n, time.Minute)
			stopAtCleanup(t, allocs[i])
			if _, err := allocs[i].Allocate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		freed, _ := idOf(allocs[1])
		if err := allocs[1].Stop(ctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if _, ok := b.holder(t, freed); ok {
			t.Fatalf("key of id %d still present after Stop", freed)
		}
		if err := allocs[1].Stop(ctx); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		if _, err := allocs[1].Allocate(ctx); !errors.Is(err, ErrStopped) {
			t.Fatalf("Allocate after Stop = %v, want ErrStopped", err)
		}
		next := b.newAlloc(t, n, time.Minute)
		stopAtCleanup(t, next)
		id, err := next.Allocate(ctx)
		if err != nil || id != freed {
			t.Fatalf("Allocate in a full pool after Stop = %d, %v; want the freed id %d", id, err, freed)
		}
	})

	t.Run("KeepAlive holds the id past its TTL; Stop closes the channel", func(t *testing.T) {
		t.Parallel()
		b := mk(t)
		a := b.newAlloc(t, 4, b.ttl)
		stopAtCleanup(t, a)
		id, err := a.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		errc := a.KeepAlive(ctx)
		time.Sleep(3 * b.ttl)
		select {
		case err := <-errc:
			t.Fatalf("KeepAlive reported %v", err)
		default:
		}
		if owner, ok := b.holder(t, id); !ok || owner != ownerOf(a) {
			t.Fatalf("after 3×TTL with KeepAlive the key holds %q (present %v)", owner, ok)
		}
		if err := a.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err, open := <-errc; open {
			t.Fatalf("channel after Stop delivered %v, want closed", err)
		}
		if _, ok := b.holder(t, id); ok {
			t.Fatal("key present after Stop")
		}
	})

	if !mk(t).leaseOutlivesKeepAlive {
		t.Run("a crashed holder's id is freed after the TTL and reused", func(t *testing.T) {
			t.Parallel()
			crashedHolderFreed(t, mk(t))
		})
	}

	t.Run("KeepAlive reports a stolen key and Stop leaves it alone", func(t *testing.T) {
		t.Parallel()
		b := mk(t)
		a := b.newAlloc(t, 2, b.ttl)
		id, err := a.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		errc := a.KeepAlive(ctx)
		b.steal(t, id, "intruder")
		select {
		case err := <-errc:
			if !errors.Is(err, ErrKeyStolen) {
				t.Fatalf("KeepAlive reported %v, want ErrKeyStolen", err)
			}
		case <-time.After(2*b.ttl + 5*time.Second):
			t.Fatal("KeepAlive did not report the stolen key")
		}
		if err, open := <-errc; open {
			t.Fatalf("second value %v, want the channel closed after a fatal error", err)
		}
		err = a.Stop(ctx)
		if owner, ok := b.holder(t, id); !ok || owner != "intruder" {
			t.Fatalf("after Stop the stolen key holds %q (present %v), want the intruder's claim untouched (Stop: %v)", owner, ok, err)
		}
	})

	t.Run("KeepAlive before Allocate", func(t *testing.T) {
		t.Parallel()
		b := mk(t)
		a := b.newAlloc(t, 2, b.ttl)
		errc := a.KeepAlive(ctx)
		if err := <-errc; !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("got %v, want ErrNotAllocated", err)
		}
		if _, open := <-errc; open {
			t.Fatal("channel not closed")
		}
		if err := a.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func ownerOf(a Allocator) string {
	switch a := a.(type) {
	case *RedisAllocator:
		return a.cfg.Owner
	case *EtcdAllocator:
		o, _ := owners.Load(a)
		return o.(string)
	}
	panic(fmt.Sprintf("unknown allocator %T", a))
}

func idOf(a Allocator) (int, bool) {
	return a.(interface{ ID() (int, bool) }).ID()
}

func crashedHolderFreed(t *testing.T, b allocBackend) {
	ctx := context.Background()
	a := b.newAlloc(t, 1, b.ttl)
	id, err := a.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kctx, crash := context.WithCancel(ctx)
	errc := a.KeepAlive(kctx)
	time.Sleep(b.ttl / 2)
	crash() // renewals stop; Stop is never called
	if err, open := <-errc; open {
		t.Fatalf("channel after ctx cancel delivered %v, want closed", err)
	}
	if _, ok := b.holder(t, id); !ok {
		t.Fatal("key vanished right after the crash, before its TTL")
	}
	other := b.newAlloc(t, 1, b.ttl)
	stopAtCleanup(t, other)
	if _, err := other.Allocate(ctx); !errors.Is(err, ErrNoFreeID) {
		t.Fatalf("Allocate while the crashed claim lives = %v, want ErrNoFreeID", err)
	}
	deadline := time.Now().Add(b.ttl + 5*time.Second)
	for {
		if _, ok := b.holder(t, id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key of crashed holder still present %s after the crash", b.ttl+5*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err := other.Allocate(ctx)
	if err != nil || got != id {
		t.Fatalf("Allocate after expiry = %d, %v; want the freed id %d", got, err, id)
	}
}
