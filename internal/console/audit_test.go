package console

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestAuditStream runs a session of reads and writes on the real Redis and
// checks the stream holds exactly one entry per attempted write, in order,
// with who, action, target, reason, time and result; refused requests and
// reads leave nothing.
var batchID = regexp.MustCompile(`batch=\d{8}T\d{6}-[0-9a-f]{8}`)

func TestAuditStream(t *testing.T) {
	f := newFixture(t)
	steps := []struct {
		auth, method, path, body string
		status                   int
		entry                    string // "action|target|reason|result"; "" = no entry
	}{
		{vw, "GET", "/admin/dlq/stats", "", 200, ""},
		{op, "POST", "/admin/dlq/retry/m2", `{"reason":"handler fixed"}`, 200, "dlq.retry|dlq:m2|handler fixed|ok"},
		{vw, "POST", "/admin/dlq/retry/m2", `{"reason":"viewer try"}`, 403, ""},
		{"", "POST", "/admin/dlq/retry/m2", `{"reason":"anon"}`, 401, ""},
		{op, "POST", "/admin/dlq/retry/m2", ``, 422, ""},
		{op, "POST", "/admin/dlq/retry/m2", `{"reason":"again"}`, 409, "dlq.retry|dlq:m2|again|conflict"},
		{op, "POST", "/admin/dlq/batch-retry", `{"filter":{"user":"u1"},"reason":"bulk"}`, 200, "dlq.batch_retry|dlq:filter user=u1 batch=*|bulk|ok"},
		// u2's letter is due now (retried above): nothing to retry, no batch named.
		{op, "POST", "/admin/dlq/batch-retry", `{"filter":{"user":"u2"},"reason":"bulk"}`, 200, "dlq.batch_retry|dlq:filter user=u2|bulk|ok"},
		{op, "POST", "/admin/dlq/purge", `{"filter":{"reason":"invalid_message","review":true},"reason":"junk"}`, 200,
			"dlq.purge|dlq:filter reason=invalid_message review=true batch=*|junk|ok"},
		{op, "POST", "/admin/ratelimit/block/u9", `{"reason":"spam","duration":"90m"}`, 200, "ratelimit.block|user:u9 for=1h30m0s|spam|ok"},
		{op, "PUT", "/admin/ratelimit/group/u9", `{"group":"suspicious","reason":"watch"}`, 200, "ratelimit.set_group|user:u9 group=suspicious|watch|ok"},
		{op, "POST", "/admin/ratelimit/whitelist/u9", `{"reason":"partner"}`, 200, "ratelimit.whitelist_add|user:u9|partner|ok"},
		{op, "DELETE", "/admin/ratelimit/whitelist/u9?reason=ended", ``, 200, "ratelimit.whitelist_remove|user:u9|ended|ok"},
		{op, "POST", "/admin/ratelimit/unblock/bad1", `{"reason":"appeal"}`, 200, "ratelimit.unblock|user:bad1|appeal|ok"},
		{vw, "GET", "/admin/ratelimit/blocked", "", 200, ""},
	}
	var want []string
	for i, s := range steps {
		r := f.do(t, s.auth, s.method, s.path, s.body)
		if r.status != s.status {
			t.Fatalf("step %d %s %s: status %d, want %d (%s)", i, s.method, s.path, r.status, s.status, r.body)
		}
		if s.entry != "" {
			want = append(want, s.entry)
		}
	}
	var got []string
	for _, e := range f.auditEntries(t) {
		if e["who"] != "alice" || e["time"] != t0.Format(time.RFC3339Nano) {
			t.Errorf("entry %v: who/time", e)
		}
		// A batch's ID is random: the entry must name one.
		target := batchID.ReplaceAllString(fmt.Sprint(e["target"]), "batch=*")
		got = append(got, fmt.Sprintf("%v|%v|%v|%v", e["action"], target, e["reason"], e["result"]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("audit stream:\n got %q\nwant %q", got, want)
	}
}

// TestAuditFailureKeepsTheAnswer: with the audit stream unwritable the
// write still answers its real result (it happened) and the miss is counted.
func TestAuditFailureKeepsTheAnswer(t *testing.T) {
	reg := prometheus.NewRegistry()
	rdb := nopRedis()
	d := newMemDLQ(t0, sampleMessages()...)
	srv, err := New(Config{Tokens: testTokens(), MaxBodyBytes: 4096}, d, newMemRL(t0), rdb, zaptest.NewLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{srv: srv, dlq: d}
	f.http = newHTTPServer(t, srv)
	r := f.do(t, op, "POST", "/admin/dlq/retry/m2", `{"reason":"x"}`)
	if r.status != 200 || !slices.Equal(d.retriedIDs(), []string{"m2"}) {
		t.Fatalf("status %d retried %v", r.status, d.retriedIDs())
	}
	if n := testenv.MetricValue(srv.m.auditFailures); n != 1 {
		t.Errorf("audit failures = %v, want 1", n)
	}
	if n := testenv.MetricValue(srv.m.requests.WithLabelValues("POST /admin/dlq/retry/{id}", "200")); n != 1 {
		t.Errorf("requests metric = %v", n)
	}
}

// TestAuditList reads the audit stream back newest first, one page at a
// time, as GET /admin/audit serves it to viewers.
func TestAuditList(t *testing.T) {
	f := newFixture(t)
	for _, u := range []string{"a1", "a2", "a3"} {
		if r := f.do(t, op, "POST", "/admin/ratelimit/unblock/"+u, `{"reason":"check `+u+`"}`); r.status != 200 {
			t.Fatalf("unblock %s: %d %s", u, r.status, r.body)
		}
	}
	var got []AuditEntry
	path := "/admin/audit?limit=2"
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("paging does not end")
		}
		r := f.do(t, vw, "GET", path, "")
		if r.status != 200 {
			t.Fatalf("audit: %d %s", r.status, r.body)
		}
		var p auditPage
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Entries...)
		if p.NextCursor == "" {
			break
		}
		path = "/admin/audit?limit=2&cursor=" + p.NextCursor
	}
	if len(got) != 3 {
		t.Fatalf("entries %+v, want 3", got)
	}
	for i, u := range []string{"a3", "a2", "a1"} {
		e := got[i]
		if e.Who != "alice" || e.Action != "ratelimit.unblock" || e.Target != "user:"+u || e.Reason != "check "+u ||
			e.Result != "ok" || e.Time != t0.Format(time.RFC3339Nano) || e.ID == "" {
			t.Errorf("entry %d = %+v, want unblock of %s by alice", i, e, u)
		}
	}
}

// TestAuditListFiltered: who, action (or its prefix) and target filter the
// audit page; a page that matches nothing more ends with no cursor.
func TestAuditListFiltered(t *testing.T) {
	f := newFixture(t)
	writes := []struct{ path, body string }{
		{"/admin/ratelimit/unblock/a1", `{"reason":"one"}`},
		{"/admin/dlq/retry/m1", `{"reason":"two"}`},
		{"/admin/ratelimit/unblock/a2", `{"reason":"three"}`},
		{"/admin/ratelimit/block/a1", `{"reason":"four","duration":"1h"}`},
	}
	for _, w := range writes {
		if r := f.do(t, op, "POST", w.path, w.body); r.status != 200 {
			t.Fatalf("%s: %d %s", w.path, r.status, r.body)
		}
	}
	for q, want := range map[string][]string{
		"action=ratelimit.unblock":     {"three", "one"},
		"action=ratelimit":             {"four", "three", "one"},
		"action=dlq":                   {"two"},
		"target=a1":                    {"four", "one"},
		"who=alice&target=user:a2":     {"three"},
		"who=bob":                      nil,
		"action=ratelimit&limit=1":     {"four"},
		"action=ratelimit.unb&limit=5": nil, // a prefix only at a dot
	} {
		r := f.do(t, vw, "GET", "/admin/audit?"+q, "")
		var p auditPage
		if err := json.Unmarshal(r.body, &p); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
		var got []string
		for _, e := range p.Entries {
			got = append(got, e.Reason)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: reasons %q, want %q", q, got, want)
		}
		if strings.HasSuffix(q, "limit=1") && p.NextCursor == "" {
			t.Errorf("%s: a full page without a cursor", q)
		}
	}
}
