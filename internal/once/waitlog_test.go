package once

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestUsersLogTheTakeoverWait: with dedup.store leases, a consumer that
// takes over a crashed owner's user waits for the dead owner's lease to
// expire, and says so (docs/operations.md: "once: waiting on claims held
// by others", with the count and the oldest wait) once the wait passes
// waitReportAfter; then the message runs.
func TestUsersLogTheTakeoverWait(t *testing.T) {
	fx := newUsersFixture(t)
	core, logs := observer.New(zapcore.WarnLevel)
	cfg := UsersConfig{Client: fx.rdb, KeyPrefix: fx.prefix, PollInterval: 5 * time.Millisecond}
	u, err := NewUsers(ctxT(t, 5*time.Second), "test", cfg, WithRegisterer(prometheus.NewRegistry()), WithLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = u.Close(ctx)
	})
	// The crashed owner's lease: nobody renews it; it expires in 7 s.
	const deadFor = 7 * time.Second
	if err := fx.rdb.Set(ctxT(t, 5*time.Second), u.leaseKey("u"), "crashed-owner", deadFor).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(time.Now().Unix(), "k:1"))
	ran := false
	st, err := u.DoTicket(ctxT(t, 20*time.Second), ts[0], func(context.Context) error { ran = true; return nil }, nil, nil)
	if err != nil || !ran {
		t.Fatalf("after the dead lease expired: %v %v (ran %v)", st, err, ran)
	}
	if waited := time.Since(start); waited < deadFor-time.Second {
		t.Fatalf("ran after %s: the dead owner's lease did not hold the user", waited)
	}
	got := logs.FilterMessageSnippet("once: waiting on claims held by others").All()
	if len(got) == 0 {
		t.Fatalf("no takeover wait logged; logs: %v", logs.All())
	}
	f := got[0].ContextMap()
	if f["waiting"] != int64(1) || f["oldest_key"] != "user u" {
		t.Fatalf("wait log fields %v, want 1 waiting on user u", f)
	}
	if w, ok := f["oldest_wait"].(time.Duration); !ok || w < waitReportAfter {
		t.Fatalf("oldest_wait %v, want ≥ %s", f["oldest_wait"], waitReportAfter)
	}
}
