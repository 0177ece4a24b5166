package coord

import (
	"context"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Close must end every goroutine a Provider started (watches, keepers,
	// lease monitors) and its client's.
	goleak.VerifyTestMain(m)
}

// wait bounds every wait for an event in these tests.
const wait = 15 * time.Second

// newProvider returns a Provider on the test etcd confined to namespace
// ns, closed at cleanup; edit adjusts its Config.
func newProvider(t *testing.T, ns string, edit ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{Endpoints: testenv.EtcdEndpoints(t), Namespace: ns, DialTimeout: 3 * time.Second}
	for _, e := range edit {
		e(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func keepAlive(d time.Duration) func(*Config) { return func(c *Config) { c.KeepAlive = d } }

// kill makes p look dead to etcd, as after kill -9: nothing renews its
// leases and nothing revokes them. It closes the client's connection, not
// the client: Client.Close is not safe beside p's goroutines' calls (the
// race detector finds its write of the watcher beside a Watch), which
// Provider.Close avoids by ending them first. (Cleanup's Close still ends
// them.)
func kill(t *testing.T, p *Provider) {
	t.Helper()
	if err := p.cli.ActiveConnection().Close(); err != nil {
		t.Fatalf("close the client's connection: %v", err)
	}
}

// recv returns the next value of ch, failing if it is closed or none comes
// within wait.
func recv[E any](t *testing.T, ch <-chan E) E {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return e
	case <-time.After(wait):
		t.Fatalf("nothing received within %s", wait)
	}
	panic("unreachable")
}

// awaitClosed fails unless ch is closed within wait (values are drained).
func awaitClosed[E any](t *testing.T, ch <-chan E) {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("channel not closed within %s", wait)
		}
	}
}

// cutWatcher wraps a Provider's etcd Watcher to interrupt its watches the
// way a broken connection does: cut ends every open watch (a response in
// flight is dropped), and watches opened while cut wait until released.
// The watches themselves are real etcd watches.
type cutWatcher struct {
	clientv3.Watcher

	mu   sync.Mutex
	gate chan struct{}        // non-nil while cut
	cuts []context.CancelFunc // of the open watches
	// waiting receives the start revision of each watch that waits at the
	// gate: proof that the interruption was noticed.
	waiting chan int64
	wg      sync.WaitGroup
}

// interceptWatches installs a cutWatcher on p; call before p watches.
func interceptWatches(t *testing.T, p *Provider) *cutWatcher {
	w := &cutWatcher{Watcher: p.cli.Watcher, waiting: make(chan int64)}
	p.cli.Watcher = w
	t.Cleanup(func() {
		_ = p.Close()
		w.wg.Wait()
	})
	return w
}

func (w *cutWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.Lock()
	gate := w.gate
	w.mu.Unlock()
	if gate != nil {
		select {
		case w.waiting <- clientv3.OpGet(key, opts...).Rev():
		case <-ctx.Done():
		}
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	fctx, cut := context.WithCancel(ctx)
	w.mu.Lock()
	w.cuts = append(w.cuts, cut)
	w.mu.Unlock()
	in := w.Watcher.Watch(fctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(out)
		for {
			select {
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- wr:
				case <-fctx.Done():
					return
				}
			case <-fctx.Done():
				return
			}
		}
	}()
	return out
}

// cut ends every open watch; watches opened until release wait for it.
func (w *cutWatcher) cut() (release func()) {
	gate := make(chan struct{})
	w.mu.Lock()
	w.gate = gate
	cuts := w.cuts
	w.cuts = nil
	w.mu.Unlock()
	for _, c := range cuts {
		c()
	}
	return func() {
		w.mu.Lock()
		w.gate = nil
		w.mu.Unlock()
		close(gate)
	}
}

// awaitRewatch returns the start revision of the watch that the cut made
// the Provider open again.
func (w *cutWatcher) awaitRewatch(t *testing.T) int64 {
	t.Helper()
	return recv(t, (<-chan int64)(w.waiting))
}

// faultProxy is Shopify's toxiproxy between a Provider and etcd, run in
// the test process: cut stops it (every connection dropped, new ones
// refused) until restore starts it again on the same address — a network
// outage.
type faultProxy struct{ px *toxiproxy.Proxy }

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(srv, "etcd", "127.0.0.1:0", target)
	if err := px.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(px.Stop)
	return &faultProxy{px: px}
}

func (p *faultProxy) addr() string { return p.px.Listen }

func (p *faultProxy) cut() { p.px.Stop() }

func (p *faultProxy) restore() {
	if err := p.px.Start(); err != nil {
		panic("toxiproxy: restart on " + p.px.Listen + ": " + err.Error())
	}
}
