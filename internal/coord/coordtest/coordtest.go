// Package coordtest gives tests a coord.Provider on the test etcd.
package coordtest

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// Provider returns a Provider on the test etcd confined to namespace ns
// (from testenv.Etcd, which deletes it when the test ends; Providers on one
// namespace are processes of one deployment), closed when the test ends;
// edit adjusts its Config.
func Provider(t testing.TB, ns string, edit ...func(*coord.Config)) *coord.Provider {
	t.Helper()
	cfg := coord.Config{Endpoints: testenv.EtcdEndpoints(t), Namespace: ns, DialTimeout: 3 * time.Second}
	for _, e := range edit {
		e(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := coord.New(ctx, cfg)
	if err != nil {
		t.Fatalf("coord.New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
