package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"
)

// TestOverview: GET /admin/overview grades each account against WeChat's
// 72-hour horizon as the alerts do, sums the partitions' lag, buckets the
// DLQ's last hour by reason, and answers with a part's error beside it
// when that part cannot be read; a viewer may read it.
func TestOverview(t *testing.T) {
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	p := &memPipeline{
		accounts: []AccountSync{
			{OpenKfID: "wk-ok", LastSuccess: at(-time.Second), Reported: t0.Add(-5 * time.Second)},
			{OpenKfID: "wk-warn", LastSuccess: at(-25 * time.Hour), OldestWaiting: at(-25 * time.Hour), Reported: t0},
			{OpenKfID: "wk-crit", OldestWaiting: at(-50 * time.Hour), Reported: t0},
			{OpenKfID: "wk-stale", LastSuccess: at(-time.Hour), Reported: t0.Add(-2 * time.Minute)},
		},
		lag: []PartitionLag{{Partition: 0, End: 100, Committed: 90, Lag: 10}, {Partition: 1, End: 5, Committed: -1, Lag: 5}},
	}
	f := newFixtureWith(t, p)
	r := f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/overview", "")
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var o overviewResponse
	if err := json.Unmarshal(r.body, &o); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, a := range o.Accounts {
		states[a.OpenKfID] = a.State
	}
	want := map[string]string{"wk-ok": "ok", "wk-warn": "warning", "wk-crit": "critical", "wk-stale": "stale"}
	for kf, s := range want {
		if states[kf] != s {
			t.Errorf("%s graded %q, want %q (all: %v)", kf, states[kf], s, states)
		}
	}
	for _, a := range o.Accounts {
		if a.OpenKfID == "wk-crit" {
			if a.HorizonLeftSeconds == nil || *a.HorizonLeftSeconds != int64(22*time.Hour/time.Second) || a.WaitingSeconds != 50*3600 {
				t.Errorf("wk-crit: %+v, want 22 h left after 50 h waiting", a)
			}
		}
		if a.OpenKfID == "wk-ok" && a.HorizonLeftSeconds != nil {
			t.Errorf("wk-ok has a horizon with nothing waiting: %d", *a.HorizonLeftSeconds)
		}
	}
	if o.LagTotal != 15 || o.EndTotal != 105 || o.CommittedTotal != 90 || len(o.Partitions) != 2 {
		t.Errorf("lag total %d end %d committed %d partitions %d, want 15 105 90 2", o.LagTotal, o.EndTotal, o.CommittedTotal, len(o.Partitions))
	}
	// m2, m3, m4 failed in the last 5 minutes before t0; m1 at t0 itself.
	if got := o.Inflow.ByReason["downstream_error"]; len(got) != inflowBuckets || got[inflowBuckets-1] != 1 {
		t.Errorf("downstream_error inflow %v, want 1 in the last bucket", got)
	}
	if got := o.Inflow.ByReason["rate_limited"]; len(got) != inflowBuckets || got[inflowBuckets-1] != 1 {
		t.Errorf("rate_limited inflow %v, want 1 in the last bucket (m4; m1 is at the window's end)", got)
	}
	if o.BlockedUsers != 2 || o.DLQ.Total != 4 || o.AccountsError != "" || o.LagError != "" {
		t.Errorf("blocked %d total %d errors %q %q", o.BlockedUsers, o.DLQ.Total, o.AccountsError, o.LagError)
	}

	// Kafka unreachable: the lag says why, the rest answers.
	p.lagErr = errors.New("kafka: all brokers down")
	r = f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/overview", "")
	o = overviewResponse{}
	if err := json.Unmarshal(r.body, &o); err != nil || r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if o.LagError == "" || len(o.Accounts) != 4 {
		t.Errorf("lag error %q with %d accounts, want the error and the accounts", o.LagError, len(o.Accounts))
	}
	if r := f.do(t, "", http.MethodGet, "/admin/overview", ""); r.status != http.StatusUnauthorized {
		t.Errorf("anonymous overview: %d", r.status)
	}
}
