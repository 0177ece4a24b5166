package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/fleet"
)

type staticFleet struct {
	ms      []fleet.Member
	changed time.Time
}

func (f staticFleet) Members() ([]fleet.Member, time.Time) { return f.ms, f.changed }

// GET /admin/fleet lists the running daemons counted by role for any
// token, and says what to configure when there is no fleet (coord off).
func TestFleetEndpoint(t *testing.T) {
	off := newFixture(t)
	r := off.do(t, "Bearer "+viewerToken, "GET", "/admin/fleet", "")
	if r.status != 503 || !strings.Contains(string(r.body), "coord.enabled") {
		t.Fatalf("without a fleet: %d %s, want 503 naming coord.enabled", r.status, r.body)
	}

	on := newFixture(t)
	on.srv.Close()
	changed := t0.Add(-time.Minute)
	on.start(t, Config{Fleet: staticFleet{changed: changed, ms: []fleet.Member{
		{ID: "dlq-consumer-h-1", Role: "dlq-consumer", AdminAddr: "10.0.0.1:9200", WorkerID: -1},
		{ID: "kf-producer-h-2", Role: "kf-producer", WorkerID: 7},
		{ID: "schedule-consumer-h-3", Role: "schedule-consumer", Partitions: []int32{0, 1}, Actors: 12, WorkerID: -1},
		{ID: "schedule-consumer-h-4", Role: "schedule-consumer", Partitions: []int32{2, 3}, WorkerID: -1},
	}}})
	r = on.do(t, "Bearer "+viewerToken, "GET", "/admin/fleet", "")
	if r.status != 200 {
		t.Fatalf("GET /admin/fleet: %d %s", r.status, r.body)
	}
	body := r.json(t)
	roles := body["by_role"].(map[string]any)
	if roles["schedule-consumer"] != 2.0 || roles["kf-producer"] != 1.0 || roles["dlq-consumer"] != 1.0 {
		t.Fatalf("by_role = %v", roles)
	}
	ms := body["members"].([]any)
	if len(ms) != 4 || ms[1].(map[string]any)["worker_id"] != 7.0 || ms[2].(map[string]any)["actors"] != 12.0 {
		t.Fatalf("members = %v", ms)
	}
	if body["changed"] != changed.Format(time.RFC3339Nano) {
		t.Fatalf("changed = %v, want %s", body["changed"], changed.Format(time.RFC3339Nano))
	}
	if r := on.do(t, "", "GET", "/admin/fleet", ""); r.status != 401 {
		t.Fatalf("anonymous GET /admin/fleet: %d", r.status)
	}
}
