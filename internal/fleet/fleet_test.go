package fleet

import (
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// waitFleet polls v until ok holds for its members.
func waitFleet(t *testing.T, v *View, what string, ok func([]Member) bool) []Member {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ms, _ := v.Members()
		if ok(ms) {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: fleet is %+v", what, ms)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Daemons join the fleet, their updates (a consumer's partitions after a
// rebalance, a producer's worker ID) reach a View, and one that leaves is
// gone from it; an update that changes nothing writes nothing.
func TestJoinUpdateLeaveSeenByView(t *testing.T) {
	_, ns := testenv.Etcd(t)
	admin, cons, prod := coordtest.Provider(t, ns), coordtest.Provider(t, ns), coordtest.Provider(t, ns)
	ctx := t.Context()
	v, err := Watch(ctx, admin, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := NewMember("schedule-consumer", "v1", "127.0.0.1:9101")
	c.ID += "-c" // two members of one test process
	self, err := Join(ctx, cons, c, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p := NewMember("kf-producer", "v1", "127.0.0.1:9100")
	p.ID += "-p"
	pself, err := Join(ctx, prod, p, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	waitFleet(t, v, "both joined", func(ms []Member) bool {
		return len(ms) == 2 && ms[0].Role == "kf-producer" && ms[1].Role == "schedule-consumer" && ms[0].WorkerID == -1
	})

	self.Update(ctx, func(m *Member) { m.Partitions, m.Actors = []int32{0, 2}, 5 })
	pself.Update(ctx, func(m *Member) { m.WorkerID = 3 })
	ms := waitFleet(t, v, "updates seen", func(ms []Member) bool {
		return len(ms) == 2 && ms[0].WorkerID == 3 && slices.Equal(ms[1].Partitions, []int32{0, 2}) && ms[1].Actors == 5
	})
	if ms[1].OpsAddr != "127.0.0.1:9101" || ms[1].Version != "v1" || ms[1].StartedAt.IsZero() || ms[1].Node == "" {
		t.Fatalf("consumer entry = %+v", ms[1])
	}
	_, before := v.Members()
	self.Update(ctx, func(m *Member) { m.Partitions = []int32{0, 2} })
	time.Sleep(300 * time.Millisecond)
	if _, after := v.Members(); !after.Equal(before) {
		t.Fatal("an update that changed nothing was written")
	}

	if err := self.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	waitFleet(t, v, "the consumer left", func(ms []Member) bool { return len(ms) == 1 && ms[0].Role == "kf-producer" })
}
