package fleet

import (
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		silent time.Duration
		want   Presence
	}{
		{0, Live},
		{-time.Second, Live}, // a reporter's clock a little ahead
		{StaleAfter, Live},
		{StaleAfter + time.Second, Stale},
		{time.Minute, Stale},
		{GoneAfter, Stale},
		{GoneAfter + time.Second, Gone},
		{30 * time.Minute, Gone}, // the field run's "(stale) 30 minutes later"
	} {
		if got := Judge(now.Add(-tc.silent), now); got != tc.want {
			t.Errorf("silent %s: %s, want %s", tc.silent, got, tc.want)
		}
	}
}

// A View shows a member whose lease expired as stale at once and drops it
// when Judge says it is gone (a lease TTL before the removal counts as
// silent); one that left cleanly is dropped at once; one that registers
// again is live again.
func TestViewShowsLapsedMembersStaleThenGone(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	v := newView(10*time.Second, func() time.Time { return now })
	killed, stopped := NewMember("schedule-consumer", "v1", "a:1"), NewMember("schedule-consumer", "v1", "b:1")
	killed.ID, stopped.ID = "killed", "stopped"
	killed.Actors = 40
	for _, m := range []Member{killed, stopped} {
		v.apply(coord.RegistryEvent{Type: coord.ServiceAdded, Service: m.info()})
	}
	leaving := stopped.info()
	leaving.Metadata[leavingKey] = "true"
	v.apply(coord.RegistryEvent{Type: coord.ServiceUpdated, Service: leaving})
	v.apply(coord.RegistryEvent{Type: coord.ServiceRemoved, Service: leaving})
	v.apply(coord.RegistryEvent{Type: coord.ServiceRemoved, Service: killed.info()})

	ms, _ := v.Members()
	if len(ms) != 1 || ms[0].ID != "killed" || !ms[0].Stale || ms[0].Actors != 40 || ms[0].LastHeard == nil ||
		!ms[0].LastHeard.Equal(now.Add(-10*time.Second)) {
		t.Fatalf("after the removals: %+v, want only the killed member, stale, heard 10s ago", ms)
	}
	now = now.Add(GoneAfter - 10*time.Second)
	if ms, _ := v.Members(); len(ms) != 1 || !ms[0].Stale {
		t.Fatalf("at GoneAfter: %+v, want the killed member stale", ms)
	}
	now = now.Add(time.Second)
	if ms, _ := v.Members(); len(ms) != 0 {
		t.Fatalf("after GoneAfter: %+v, want none", ms)
	}

	// Killed again, then back (its registration renewed after a cut).
	v.apply(coord.RegistryEvent{Type: coord.ServiceAdded, Service: killed.info()})
	v.apply(coord.RegistryEvent{Type: coord.ServiceRemoved, Service: killed.info()})
	v.apply(coord.RegistryEvent{Type: coord.ServiceAdded, Service: killed.info()})
	if ms, _ := v.Members(); len(ms) != 1 || ms[0].Stale || ms[0].LastHeard != nil {
		t.Fatalf("registered again: %+v, want it live", ms)
	}
}
