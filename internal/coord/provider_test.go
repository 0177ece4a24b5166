package coord

import (
	"errors"
	"testing"

	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Close releases registrations, locks and instance IDs (their keys are gone
// at once, not at lease expiry), ends the watches, and refuses new work;
// TestMain's goleak check proves its goroutines ended.
func TestCloseReleasesEverything(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	other := newProvider(t, ns)
	ctx := t.Context()

	if err := p.Registry().Register(ctx, ServiceInfo{Name: "svc", ID: "1", Addr: "h:1"}, 0); err != nil {
		t.Fatal(err)
	}
	l, err := p.NewLock("job", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := p.InstanceIDAllocator("svc", 10)
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.AcquireID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Set(ctx, p.Config(), "kept", 1); err != nil {
		t.Fatal(err)
	}
	cw, err := WatchPrefix[int](ctx, p.Config(), "")
	if err != nil {
		t.Fatal(err)
	}
	rw, err := p.Registry().Watch(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	// A watch of another Provider sees the registration go.
	seen, err := other.Registry().Watch(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	expectService(t, seen, ServiceAdded, "1", "h:1")

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Gone when Close returns, not when the leases expire.
	for _, dir := range []string{dirServices, dirLocks, dirInstanceIDs} {
		resp, err := raw.Get(ctx, ns+dir, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 0 {
			t.Errorf("%d keys left under %s after Close (%v)", resp.Count, dir, err)
		}
	}
	awaitClosed(t, cw)
	awaitClosed(t, rw)
	expectService(t, seen, ServiceRemoved, "1", "h:1")
	select {
	case <-id.Done():
	default:
		t.Fatal("AllocatedID.Done not closed by Close")
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Lock.Done not closed by Close")
	}
	if v, err := Get[int](ctx, other.Config(), "kept"); err != nil || v != 1 {
		t.Errorf("config value after Close = %d, %v; config is not held, it stays", v, err)
	}

	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Registry().Register(ctx, ServiceInfo{Name: "svc", ID: "2"}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
	if _, err := p.InstanceIDAllocator("x", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("InstanceIDAllocator after Close: %v, want ErrClosed", err)
	}
	if _, err := a.AcquireID(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("AcquireID after Close: %v, want ErrClosed", err)
	}
	if err := l.Acquire(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if _, err := Watch[int](ctx, p.Config(), "kept"); !errors.Is(err, ErrClosed) {
		t.Errorf("Watch after Close: %v, want ErrClosed", err)
	}
}

// Providers sharing a Prometheus registry share its collectors.
func TestMetricsShareRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := newMetrics(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	m1.resyncs.Inc()
	m2.lost.WithLabelValues(kindLock).Inc()
	if testenv.MetricValue(m2.resyncs) != 1 || testenv.MetricValue(m1.lost.WithLabelValues(kindLock)) != 1 {
		t.Fatal("the second Provider's metrics are not the registered ones")
	}
}
