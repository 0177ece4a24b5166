package ratelimit

import (
	"errors"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// Rule changes are compare-and-set on both backends: a change made against
// a version that is no longer current is refused with the current version,
// and nothing is written — two operators never overwrite each other
// unseen. With etcd the rules and the group assignments reach every
// limiter through the watch, within a second.
func TestRulesCompareAndSetAndLiveOnEtcd(t *testing.T) {
	for _, backend := range []string{"redis", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			store := redisStore(t)
			clock := newFakeClock()
			var opts []Option
			if backend == "etcd" {
				_, ns := testenv.Etcd(t)
				opts = append(opts, WithEtcdRules(coordtest.Provider(t, ns).Config()))
			}
			cfg := seedConfig()
			nodeA := newLimiter(t, cfg, store, append(opts, WithClock(clock))...)
			nodeB := newLimiter(t, cfg, store, append(opts, WithClock(clock))...)
			admin, err := NewAdmin(store, cfg, append(opts, WithClock(clock))...)
			if err != nil {
				t.Fatal(err)
			}
			if admin.RulesBackend() != backend {
				t.Fatalf("backend %s", admin.RulesBackend())
			}
			rules, v0, err := admin.RulesVersion(bg)
			if err != nil || rules["normal"].MaxMessages != 5 {
				t.Fatalf("RulesVersion = %v, %d, %v", rules, v0, err)
			}
			normal := rules["normal"]
			normal.MaxMessages = 2
			rules["normal"] = normal
			v1, err := admin.SetRulesIf(bg, rules, v0)
			if err != nil || v1 == v0 {
				t.Fatalf("SetRulesIf at %d: %d, %v", v0, v1, err)
			}
			// A second operator who read version v0 too.
			stale := seedConfig().Groups
			_, err = admin.SetRulesIf(bg, stale, v0)
			var conflict *RulesConflictError
			if !errors.As(err, &conflict) || !errors.Is(err, ErrRulesConflict) || conflict.Current != v1 {
				t.Fatalf("stale SetRulesIf: %v, want a conflict naming version %d", err, v1)
			}
			if got, v, _ := admin.RulesVersion(bg); got["normal"].MaxMessages != 2 || v != v1 {
				t.Fatalf("after the refused write: max %d at version %d, want 2 at %d", got["normal"].MaxMessages, v, v1)
			}
			for name, l := range map[string]*Limiter{"A": nodeA, "B": nodeB} {
				took := testenv.Eventually(t, time.Second, func() error {
					return testenv.Check(l.rules.Load().lookup("normal").max == 2, "%s", "rules on node "+name)
				})
				t.Logf("%s: rules reached node %s after %s", backend, name, took)
			}

			// A group assignment reaches the node that holds the user.
			at := t0.Add(time.Hour)
			if d := nodeA.Allow(bg, "u1", at); !d.Allowed {
				t.Fatalf("first message: %+v", d)
			}
			if err := admin.SetGroup(bg, "u1", "suspicious"); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Second, func() error {
				st := nodeA.lookup("u1")
				st.mu.Lock()
				defer st.mu.Unlock()
				return testenv.Check(st.group == "suspicious", "u1 in suspicious on node A")
			})
			if st, err := admin.Status(bg, "u1"); err != nil || st.Group != "suspicious" {
				t.Fatalf("Status = %+v, %v", st, err)
			}
			if err := admin.Whitelist(bg, "u2"); err != nil {
				t.Fatal(err)
			}
			if err := admin.RemoveWhitelist(bg, "u1"); !errors.Is(err, ErrNotWhitelisted) {
				t.Fatalf("RemoveWhitelist of a suspicious user: %v", err)
			}
			if err := admin.RemoveWhitelist(bg, "u2"); err != nil {
				t.Fatal(err)
			}
			// A limiter started now (a restart) starts on the current rules
			// and assignments.
			nodeC := newLimiter(t, cfg, store, append(opts, WithClock(clock))...)
			if m := nodeC.rules.Load().lookup("normal").max; m != 2 {
				t.Fatalf("new node starts with max %d, want 2", m)
			}
			if d := nodeC.Allow(bg, "u1", at); !d.Allowed {
				t.Fatalf("u1 on the new node: %+v", d)
			}
			st := nodeC.lookup("u1")
			st.mu.Lock()
			g := st.group
			st.mu.Unlock()
			if g != "suspicious" {
				t.Fatalf("u1 on the new node is in %q, want suspicious", g)
			}
		})
	}
}
