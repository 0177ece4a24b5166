package console

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
		consumers: []ConsumerStatus{{Node: "c1", Actors: 30, OpenBreakers: 1, Partitions: 6, Reported: t0.Add(-5 * time.Second)},
			{Node: "c2", Actors: 12, OpenBreakers: 2, Partitions: 6, Reported: t0},
			{Node: "c0-gone", Actors: 99, OpenBreakers: 9, Reported: t0.Add(-time.Minute)}},
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

	if o.Actors != 42 || o.OpenBreakers != 3 || len(o.Consumers) != 3 || !o.Consumers[0].Stale || o.Consumers[1].Stale {
		t.Errorf("actors %d breakers %d consumers %+v, want 42 3 and c0-gone stale", o.Actors, o.OpenBreakers, o.Consumers)
	}
	for _, pl := range o.Partitions {
		if pl.CommitAgeSeconds == nil || !pl.CommitAgeAtLeast {
			t.Errorf("partition %d: commit age %v at least %v, want known since the first sample", pl.Partition, pl.CommitAgeSeconds, pl.CommitAgeAtLeast)
		}
	}

	// Kafka unreachable: the lag says why, the rest answers.
	p.setLag(p.lag, errors.New("kafka: all brokers down"))
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

// TestCommitAge: a partition's commit age counts from the sample where its
// committed offset last moved; one that never moved is "at least" since the
// first sample.
func TestCommitAge(t *testing.T) {
	var c commitAges
	lag := func(committed ...int64) []PartitionLag {
		var out []PartitionLag
		for i, o := range committed {
			out = append(out, PartitionLag{Partition: int32(i), Committed: o})
		}
		return out
	}
	c.observe(lag(10, 20), t0)
	c.observe(lag(11, 20), t0.Add(15*time.Second))
	got := lag(11, 20)
	c.observe(got, t0.Add(40*time.Second))
	if *got[0].CommitAgeSeconds != 25 || got[0].CommitAgeAtLeast {
		t.Errorf("moved partition: age %d at least %v, want 25 false", *got[0].CommitAgeSeconds, got[0].CommitAgeAtLeast)
	}
	if *got[1].CommitAgeSeconds != 40 || !got[1].CommitAgeAtLeast {
		t.Errorf("still partition: age %d at least %v, want 40 true", *got[1].CommitAgeSeconds, got[1].CommitAgeAtLeast)
	}
}
