package console

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

// The group rules are read with their version and changed by
// compare-and-set: a change against a version that is no longer current is
// refused with 409 and the current version (two operators never overwrite
// each other unseen), unusable rules with 422, a viewer with 403; every
// attempt is audited.
func TestRateLimitRulesCompareAndSet(t *testing.T) {
	f := newFixture(t)
	r := f.do(t, "Bearer "+viewerToken, "GET", "/admin/ratelimit/rules", "")
	if r.status != 200 {
		t.Fatalf("GET rules: %d %s", r.status, r.body)
	}
	if v := r.json(t)["version"]; v != 0.0 {
		t.Fatalf("version = %v, want 0", v)
	}
	put := func(auth, body string) response {
		return f.do(t, "Bearer "+auth, "PUT", "/admin/ratelimit/rules", body)
	}
	const rules = `"groups": {"normal": {"window_seconds": 10, "max_messages": 2, "penalty_threshold": 3, "block_hours": 1}}`
	if r := put(viewerToken, `{"version": 0, "reason": "x", `+rules+`}`); r.status != 403 {
		t.Fatalf("viewer PUT: %d", r.status)
	}
	if r := put(operatorToken, `{"reason": "tighten", `+rules+`}`); r.status != 422 || !strings.Contains(string(r.body), `"field":"version"`) {
		t.Fatalf("PUT without version: %d %s", r.status, r.body)
	}
	r = put(operatorToken, `{"version": 0, "reason": "tighten", `+rules+`}`)
	if r.status != 200 || r.json(t)["version"] != 1.0 {
		t.Fatalf("PUT at version 0: %d %s", r.status, r.body)
	}
	// A second operator who also read version 0.
	r = put(operatorToken, `{"version": 0, "reason": "loosen", "groups": {"normal": {"window_seconds": 10, "max_messages": 9, "penalty_threshold": 3, "block_hours": 1}}}`)
	if r.status != 409 || r.json(t)["current_version"] != 1.0 {
		t.Fatalf("stale PUT: %d %s, want 409 with current_version 1", r.status, r.body)
	}
	if g := f.do(t, "Bearer "+viewerToken, "GET", "/admin/ratelimit/rules", "").json(t)["groups"].(map[string]any)["normal"].(map[string]any); g["max_messages"] != 2.0 {
		t.Fatalf("rules after the refused PUT: %v, want the first change (max 2)", g)
	}
	if r := put(operatorToken, `{"version": 1, "reason": "oops", "groups": {"vip": {"window_seconds": 10, "max_messages": 9, "penalty_threshold": 3, "block_hours": 1}}}`); r.status != 422 {
		t.Fatalf("rules without the default group: %d %s", r.status, r.body)
	}
	results := map[string]int{}
	for _, e := range f.auditEntries(t) {
		if e["action"] == "ratelimit.set_rules" {
			results[e["result"].(string)]++
		}
	}
	if results["ok"] != 1 || results["conflict"] != 1 || results["invalid"] != 1 {
		t.Fatalf("audited rule changes by result: %v, want ok 1, conflict 1, invalid 1", results)
	}
}
