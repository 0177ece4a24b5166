package console

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

var (
	op = "Bearer " + operatorToken
	vw = "Bearer " + viewerToken
)

func TestEndpoints(t *testing.T) {
	type check func(t *testing.T, f *fixture, r response)
	wantCount := func(n float64) check {
		return func(t *testing.T, _ *fixture, r response) {
			if got := r.json(t)["count"]; got != n {
				t.Errorf("count = %v, want %v", got, n)
			}
		}
	}
	listIDs := func(want ...string) check {
		return func(t *testing.T, _ *fixture, r response) {
			var page messagePage
			if err := json.Unmarshal(r.body, &page); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range page.Messages {
				got = append(got, m.ID)
			}
			if !slices.Equal(got, want) {
				t.Errorf("ids = %v, want %v", got, want)
			}
		}
	}
	storeDown := func(f *fixture) { f.dlq.fail = errStoreDown; f.rl.fail = errStoreDown }
	cases := []struct {
		name   string
		setup  func(f *fixture)
		auth   string
		method string
		path   string
		body   string
		status int
		field  string // of the JSON error
		audit  string // "action result" of the one audit entry expected; "" = none
		check  check
	}{
		// DLQ reads.
		{name: "stats", auth: vw, method: "GET", path: "/admin/dlq/stats", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				var st DLQStats
				_ = json.Unmarshal(r.body, &st)
				if st.Total != 4 || st.ByReason["rate_limited"] != 2 || st.Review != 2 {
					t.Errorf("stats = %+v", st)
				}
			}},
		{name: "stats store down", setup: storeDown, auth: vw, method: "GET", path: "/admin/dlq/stats", status: 503,
			check: func(t *testing.T, _ *fixture, r response) {
				if strings.Contains(string(r.body), "10.9.9.9") {
					t.Errorf("store detail leaked to the client: %s", r.body)
				}
			}},
		{name: "list all", auth: vw, method: "GET", path: "/admin/dlq/messages", status: 200, check: listIDs("m1", "m2", "m3", "m4")},
		{name: "list by user", auth: vw, method: "GET", path: "/admin/dlq/messages?user=u1", status: 200, check: listIDs("m1", "m3")},
		{name: "list by reason and review", auth: vw, method: "GET", path: "/admin/dlq/messages?reason=rate_limited&review=false", status: 200, check: listIDs("m1", "m4")},
		{name: "list in review", auth: vw, method: "GET", path: "/admin/dlq/messages?review=true", status: 200, check: listIDs("m2", "m3")},
		{name: "list page 1", auth: vw, method: "GET", path: "/admin/dlq/messages?limit=2", status: 200,
			check: func(t *testing.T, f *fixture, r response) {
				listIDs("m1", "m2")(t, f, r)
				if c := r.json(t)["next_cursor"]; c != "c2" {
					t.Errorf("next_cursor = %v", c)
				}
			}},
		{name: "list page 2", auth: vw, method: "GET", path: "/admin/dlq/messages?limit=2&cursor=c2", status: 200, check: listIDs("m3", "m4")},
		{name: "list limit 0", auth: vw, method: "GET", path: "/admin/dlq/messages?limit=0", status: 400, field: "limit"},
		{name: "list limit 501", auth: vw, method: "GET", path: "/admin/dlq/messages?limit=501", status: 400, field: "limit"},
		{name: "list limit text", auth: vw, method: "GET", path: "/admin/dlq/messages?limit=ten", status: 400, field: "limit"},
		{name: "list bad review", auth: vw, method: "GET", path: "/admin/dlq/messages?review=maybe", status: 400, field: "review"},
		{name: "list bad reason", auth: vw, method: "GET", path: "/admin/dlq/messages?reason=Rate-Limited!", status: 400, field: "reason"},
		{name: "list bad user", auth: vw, method: "GET", path: "/admin/dlq/messages?user=a%07b", status: 400, field: "user"},
		{name: "list foreign cursor", auth: vw, method: "GET", path: "/admin/dlq/messages?cursor=zzz", status: 400, field: "cursor"},
		{name: "list store down", setup: storeDown, auth: vw, method: "GET", path: "/admin/dlq/messages", status: 503},
		{name: "get", auth: vw, method: "GET", path: "/admin/dlq/messages/m1", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				var m DLQMessage
				_ = json.Unmarshal(r.body, &m)
				if m.ID != "m1" || string(m.Message) != `{"text":"hi"}` || m.SourceOffset != 10 {
					t.Errorf("message = %+v", m)
				}
			}},
		{name: "get unknown", auth: vw, method: "GET", path: "/admin/dlq/messages/nope", status: 404},
		{name: "get control char id", auth: vw, method: "GET", path: "/admin/dlq/messages/a%00b", status: 400, field: "id"},

		// DLQ writes.
		{name: "retry", auth: op, method: "POST", path: "/admin/dlq/retry/m2", body: `{"reason":"downstream fixed"}`,
			status: 200, audit: "dlq.retry ok", check: func(t *testing.T, f *fixture, _ response) {
				if got := f.dlq.retriedIDs(); !slices.Equal(got, []string{"m2"}) {
					t.Errorf("retried = %v", got)
				}
			}},
		{name: "retry dry run", auth: op, method: "POST", path: "/admin/dlq/retry/m2", body: `{"reason":"would it?","dry_run":true}`,
			status: 200, audit: "dlq.retry dry_run", check: func(t *testing.T, f *fixture, r response) {
				if got := f.dlq.retriedIDs(); len(got) != 0 {
					t.Errorf("dry run retried %v", got)
				}
				if m := r.json(t); m["dry_run"] != true {
					t.Errorf("answer %v, want dry_run true", m)
				}
			}},
		{name: "retry a retried letter", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reason":"again"}`,
			status: 409, audit: "dlq.retry conflict"},
		{name: "retry dry run of a retried letter", auth: op, method: "POST", path: "/admin/dlq/retry/m4",
			body: `{"reason":"again?","dry_run":true}`, status: 409, audit: "dlq.retry dry_run_conflict"},
		{name: "retry invalid with include_invalid", auth: op, method: "POST", path: "/admin/dlq/retry/m3",
			body: `{"reason":"producer fixed","include_invalid":true}`, status: 200, audit: "dlq.retry ok",
			check: func(t *testing.T, f *fixture, _ response) {
				if got := f.dlq.retriedIDs(); !slices.Equal(got, []string{"m3"}) {
					t.Errorf("retried = %v", got)
				}
				if e := f.auditEntries(t)[0]; e["target"] != "dlq:m3 include_invalid" {
					t.Errorf("audit target %v, want it to name include_invalid", e["target"])
				}
			}},
		{name: "retry dry run of invalid", auth: op, method: "POST", path: "/admin/dlq/retry/m3",
			body: `{"reason":"try","dry_run":true}`, status: 409, audit: "dlq.retry dry_run_conflict"},
		{name: "retry pulls a later retry forward", auth: op, method: "POST", path: "/admin/dlq/retry/m1", body: `{"reason":"now"}`,
			status: 200, audit: "dlq.retry ok"},
		{name: "retry reason from query", auth: op, method: "POST", path: "/admin/dlq/retry/m2?reason=ticket-42", status: 200, audit: "dlq.retry ok"},
		{name: "retry not retryable", auth: op, method: "POST", path: "/admin/dlq/retry/m3", body: `{"reason":"try"}`,
			status: 409, audit: "dlq.retry conflict"},
		{name: "retry unknown", auth: op, method: "POST", path: "/admin/dlq/retry/nope", body: `{"reason":"try"}`,
			status: 404, audit: "dlq.retry not_found"},
		{name: "retry store down", setup: storeDown, auth: op, method: "POST", path: "/admin/dlq/retry/m1", body: `{"reason":"try"}`,
			status: 503, audit: "dlq.retry error"},
		{name: "retry without reason", auth: op, method: "POST", path: "/admin/dlq/retry/m4", status: 422, field: "reason"},
		{name: "retry blank reason", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reason":"  "}`, status: 422, field: "reason"},
		{name: "retry reason too long", auth: op, method: "POST", path: "/admin/dlq/retry/m4",
			body: `{"reason":"` + strings.Repeat("x", maxReasonLen+1) + `"}`, status: 422, field: "reason"},
		{name: "retry unknown field", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reasn":"typo"}`, status: 400, field: "reasn"},
		{name: "retry malformed json", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reason":`, status: 400},
		{name: "retry wrong type", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reason":5}`, status: 400, field: "reason"},
		{name: "retry two values", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `{"reason":"a"}{"reason":"b"}`, status: 400},
		{name: "retry array body", auth: op, method: "POST", path: "/admin/dlq/retry/m4", body: `["reason"]`, status: 400},
		{name: "batch retry by user", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"user":"u1"},"reason":"handler fixed"}`, status: 200, audit: "dlq.batch_retry ok", check: wantCount(1)},
		{name: "batch retry all", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"all":true},"reason":"outage over"}`, status: 200, audit: "dlq.batch_retry ok", check: wantCount(2)},
		{name: "batch retry all with invalid", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"all":true},"reason":"producer fixed","include_invalid":true}`, status: 200, audit: "dlq.batch_retry ok", check: wantCount(3)},
		{name: "batch retry unblock", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"user":"u1"},"reason":"was a human","unblock":true}`, status: 200, audit: "dlq.batch_retry ok",
			setup: func(f *fixture) { f.rl.block["u1"] = time.Hour },
			check: func(t *testing.T, f *fixture, r response) {
				if m := r.json(t); m["count"] != 1.0 || m["unblocked"] != "u1" {
					t.Errorf("answer %v, want count 1, unblocked u1", m)
				}
				if _, blocked := f.rl.block["u1"]; blocked {
					t.Errorf("u1 still blocked after unblock-and-retry")
				}
				if e := f.auditEntries(t)[0]; !strings.Contains(fmt.Sprint(e["target"]), "user=u1 unblock batch=") {
					t.Errorf("audit target %v", e["target"])
				}
			}},
		{name: "batch retry dry run warns of blocked users", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"user":"u1"},"reason":"how many?","dry_run":true}`, status: 200, audit: "dlq.batch_retry dry_run",
			setup: func(f *fixture) { f.rl.block["u1"] = time.Hour },
			check: func(t *testing.T, f *fixture, r response) {
				p := plan(t, r)
				if p.Count != 1 || len(p.Blocked) != 1 || p.Blocked[0].User != "u1" || p.NotRetryable != 1 || p.Users != 1 || p.Messages != 1 {
					t.Errorf("plan %+v, want 1 to retry of blocked u1, 1 not retryable", p)
				}
				if _, blocked := f.rl.block["u1"]; !blocked {
					t.Errorf("a dry run unblocked u1")
				}
			}},
		{name: "batch unblock without user", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"reason":"rate_limited"},"reason":"x","unblock":true}`, status: 422, field: "unblock"},
		{name: "purge with include_invalid", auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"x","include_invalid":true}`, status: 422, field: "include_invalid"},
		{name: "batch retry limit", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"reason":"rate_limited","limit":1},"reason":"one"}`, status: 200, audit: "dlq.batch_retry ok", check: wantCount(1)},
		{name: "batch retry dry run", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"all":true},"reason":"how many?","dry_run":true}`, status: 200, audit: "dlq.batch_retry dry_run",
			check: func(t *testing.T, f *fixture, r response) {
				if m := r.json(t); m["count"] != 2.0 || m["dry_run"] != true || m["not_retryable"] != 1.0 || m["settled"] != 1.0 {
					t.Errorf("answer %v, want count 2 (1 not retryable, 1 retried already) dry_run true", m)
				}
				if ids := f.dlq.retriedIDs(); len(ids) != 0 {
					t.Errorf("dry run retried %v", ids)
				}
			}},
		{name: "purge dry run", auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"how many?","dry_run":true}`, status: 200, audit: "dlq.purge dry_run",
			check: func(t *testing.T, f *fixture, r response) {
				if m := r.json(t); m["count"] != 2.0 || m["dry_run"] != true {
					t.Errorf("answer %v, want count 2 dry_run true", m)
				}
				if n := len(f.dlq.msgs); n != 4 {
					t.Errorf("dry run purged: %d messages left, want 4", n)
				}
			}},
		{name: "dry run still needs operator", auth: vw, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"x","dry_run":true}`, status: 403},
		{name: "dry run wrong type", auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"x","dry_run":"yes"}`, status: 400, field: "dry_run"},
		{name: "health", auth: vw, method: "GET", path: "/admin/health", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				var h healthResponse
				if err := json.Unmarshal(r.body, &h); err != nil {
					t.Fatal(err)
				}
				if h.Status != "attention" || h.ReviewBacklog != 2 || h.BlockedUsers != 2 || h.BlockedUsersCapped ||
					h.DLQ.Total != 4 || len(h.Attention) == 0 || !h.Time.Equal(t0) {
					t.Errorf("health %+v", h)
				}
			}},
		{name: "health store down", setup: storeDown, auth: vw, method: "GET", path: "/admin/health", status: 503},
		{name: "audit empty", auth: vw, method: "GET", path: "/admin/audit", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if m := r.json(t); fmt.Sprint(m["entries"]) != "[]" || m["next_cursor"] != "" {
					t.Errorf("audit %v", m)
				}
			}},
		{name: "audit bad cursor", auth: vw, method: "GET", path: "/admin/audit?cursor=abc", status: 400, field: "cursor"},
		{name: "audit bad limit", auth: vw, method: "GET", path: "/admin/audit?limit=0", status: 400, field: "limit"},
		{name: "batch retry no filter", auth: op, method: "POST", path: "/admin/dlq/batch-retry", body: `{"reason":"x"}`, status: 422, field: "filter"},
		{name: "batch retry empty filter", auth: op, method: "POST", path: "/admin/dlq/batch-retry", body: `{"filter":{},"reason":"x"}`, status: 422, field: "filter"},
		{name: "batch retry all with user", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"all":true,"user":"u1"},"reason":"x"}`, status: 422, field: "filter.all"},
		{name: "batch retry bad failure reason", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"reason":"NOPE"},"reason":"x"}`, status: 422, field: "filter.reason"},
		{name: "batch retry negative limit", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"user":"u1","limit":-1},"reason":"x"}`, status: 422, field: "filter.limit"},
		{name: "batch retry unknown filter field", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"usr":"u1"},"reason":"x"}`, status: 400, field: "usr"},
		{name: "batch retry without reason", auth: op, method: "POST", path: "/admin/dlq/batch-retry",
			body: `{"filter":{"user":"u1"}}`, status: 422, field: "reason"},
		{name: "purge by reason", auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"reason":"rate_limited"},"reason":"noise"}`, status: 200, audit: "dlq.purge ok",
			check: func(t *testing.T, f *fixture, r response) {
				wantCount(2)(t, f, r)
				if b := f.waitBatch(t, r); b.State != BatchDone || b.Acted != 2 || b.Gone != 0 {
					t.Errorf("batch ended %+v, want done with 2 purged", b)
				}
				f.dlq.mu.Lock()
				defer f.dlq.mu.Unlock()
				if n := len(f.dlq.msgs); n != 2 {
					t.Errorf("%d messages left, want 2", n)
				}
			}},
		{name: "purge empty filter", auth: op, method: "POST", path: "/admin/dlq/purge", body: `{"filter":{},"reason":"oops"}`, status: 422, field: "filter"},
		{name: "purge store down", setup: storeDown, auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"x"}`, status: 503, audit: "dlq.purge error"},

		// Export.
		{name: "export csv", auth: vw, method: "GET", path: "/admin/dlq/export?format=csv", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/csv") {
					t.Errorf("content type %q", ct)
				}
				rows, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) != 5 || !slices.Equal(rows[0], csvHeader) || rows[1][0] != "m1" {
					t.Fatalf("rows = %q", rows)
				}
				if d := rows[2][len(csvHeader)-1]; d != `'=HYPERLINK("x")` {
					t.Errorf("formula not defused: %q", d)
				}
			}},
		{name: "export json filtered", auth: vw, method: "GET", path: "/admin/dlq/export?format=json&user=u1", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
				if len(lines) != 2 {
					t.Fatalf("lines = %q", lines)
				}
				for _, l := range lines {
					var m DLQMessage
					if err := json.Unmarshal([]byte(l), &m); err != nil || m.User != "u1" {
						t.Errorf("line %q: %v", l, err)
					}
				}
			}},
		{name: "export empty csv has header", auth: vw, method: "GET", path: "/admin/dlq/export?user=nobody", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if got := strings.TrimSpace(string(r.body)); got != strings.Join(csvHeader, ",") {
					t.Errorf("body %q", got)
				}
			}},
		{name: "export bad format", auth: vw, method: "GET", path: "/admin/dlq/export?format=xml", status: 400, field: "format"},
		{name: "export bad review", auth: vw, method: "GET", path: "/admin/dlq/export?review=2", status: 400, field: "review"},
		{name: "export store down", setup: storeDown, auth: vw, method: "GET", path: "/admin/dlq/export", status: 503},

		// Rate limits.
		{name: "status", auth: vw, method: "GET", path: "/admin/ratelimit/status/u1", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if m := r.json(t); m["group"] != "normal" || m["blocked"] != false {
					t.Errorf("status %v", m)
				}
			}},
		{name: "status blocked", auth: vw, method: "GET", path: "/admin/ratelimit/status/bad1", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if m := r.json(t); m["blocked"] != true || m["permanent"] != true {
					t.Errorf("status %v", m)
				}
			}},
		{name: "status bad user", auth: vw, method: "GET", path: "/admin/ratelimit/status/a%0Ab", status: 400, field: "user"},
		{name: "status store down", setup: storeDown, auth: vw, method: "GET", path: "/admin/ratelimit/status/u1", status: 503},
		{name: "blocked", auth: vw, method: "GET", path: "/admin/ratelimit/blocked", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				var p blockedPage
				_ = json.Unmarshal(r.body, &p)
				if len(p.Users) != 2 || p.Users[0].User != "bad1" || !p.Users[0].Permanent || p.Users[1].BlockedUntil == nil || p.NextCursor != "" {
					t.Errorf("page %+v", p)
				}
			}},
		{name: "blocked paged", auth: vw, method: "GET", path: "/admin/ratelimit/blocked?limit=1", status: 200,
			check: func(t *testing.T, _ *fixture, r response) {
				if c := r.json(t)["next_cursor"]; c != "1" {
					t.Errorf("next_cursor %v", c)
				}
			}},
		{name: "blocked bad cursor", auth: vw, method: "GET", path: "/admin/ratelimit/blocked?cursor=-1", status: 400, field: "cursor"},
		{name: "blocked bad limit", auth: vw, method: "GET", path: "/admin/ratelimit/blocked?limit=9999", status: 400, field: "limit"},
		{name: "unblock", auth: op, method: "POST", path: "/admin/ratelimit/unblock/bad1", body: `{"reason":"false positive"}`,
			status: 200, audit: "ratelimit.unblock ok", check: func(t *testing.T, f *fixture, _ response) {
				if _, ok := f.rl.block["bad1"]; ok {
					t.Error("bad1 still blocked")
				}
			}},
		{name: "unblock without reason", auth: op, method: "POST", path: "/admin/ratelimit/unblock/bad1", status: 422, field: "reason"},
		{name: "block for 2h", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"spam","duration":"2h"}`,
			status: 200, audit: "ratelimit.block ok", check: func(t *testing.T, f *fixture, _ response) {
				if d, ok := f.rl.block["u7"]; !ok || d != 2*time.Hour {
					t.Errorf("block = %v %v", d, ok)
				}
			}},
		{name: "block permanently", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"abuse"}`,
			status: 200, audit: "ratelimit.block ok", check: func(t *testing.T, f *fixture, r response) {
				if d, ok := f.rl.block["u7"]; !ok || d != 0 || r.json(t)["permanent"] != true {
					t.Errorf("block = %v %v", d, ok)
				}
			}},
		{name: "block bad duration", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"x","duration":"banana"}`, status: 422, field: "duration"},
		{name: "block negative duration", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"x","duration":"-1h"}`, status: 422, field: "duration"},
		{name: "block too short", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"x","duration":"500ms"}`, status: 422, field: "duration"},
		{name: "block numeric duration", auth: op, method: "POST", path: "/admin/ratelimit/block/u7", body: `{"reason":"x","duration":3600}`, status: 400, field: "duration"},
		{name: "whitelist add", auth: op, method: "POST", path: "/admin/ratelimit/whitelist/bad2", body: `{"reason":"partner"}`,
			status: 200, audit: "ratelimit.whitelist_add ok", check: func(t *testing.T, f *fixture, _ response) {
				if f.rl.group["bad2"] != "whitelist" {
					t.Error("not whitelisted")
				}
			}},
		{name: "whitelist remove", setup: func(f *fixture) { f.rl.group["u5"] = "whitelist" }, auth: op, method: "DELETE",
			path: "/admin/ratelimit/whitelist/u5", body: `{"reason":"contract ended"}`, status: 200, audit: "ratelimit.whitelist_remove ok"},
		{name: "whitelist remove not whitelisted", auth: op, method: "DELETE", path: "/admin/ratelimit/whitelist/u6?reason=cleanup",
			status: 409, audit: "ratelimit.whitelist_remove conflict"},
		{name: "set group", auth: op, method: "PUT", path: "/admin/ratelimit/group/u1", body: `{"group":"vip","reason":"paid"}`,
			status: 200, audit: "ratelimit.set_group ok", check: func(t *testing.T, f *fixture, _ response) {
				if f.rl.group["u1"] != "vip" {
					t.Error("group not set")
				}
			}},
		{name: "set unknown group", auth: op, method: "PUT", path: "/admin/ratelimit/group/u1", body: `{"group":"gold","reason":"x"}`,
			status: 422, field: "group", audit: "ratelimit.set_group invalid"},
		{name: "set empty group", auth: op, method: "PUT", path: "/admin/ratelimit/group/u1", body: `{"reason":"x"}`, status: 422, field: "group"},
		{name: "set group without reason", auth: op, method: "PUT", path: "/admin/ratelimit/group/u1", body: `{"group":"vip"}`, status: 422, field: "reason"},

		// Routing and limits.
		{name: "unknown path", auth: vw, method: "GET", path: "/admin/nope", status: 404},
		{name: "wrong method", auth: vw, method: "PATCH", path: "/admin/dlq/stats", status: 405,
			check: func(t *testing.T, _ *fixture, r response) {
				if a := r.header.Get("Allow"); !strings.Contains(a, "GET") {
					t.Errorf("Allow = %q", a)
				}
			}},
		{name: "body too large", auth: op, method: "POST", path: "/admin/dlq/retry/m4",
			body: `{"reason":"` + strings.Repeat("x", 4096) + `"}`, status: 413},
		{name: "batch body too large", auth: op, method: "POST", path: "/admin/dlq/purge",
			body: `{"filter":{"user":"u1"},"reason":"x","pad":"` + strings.Repeat("x", 4096) + `"}`, status: 413},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			r := f.do(t, tc.auth, tc.method, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status = %d, want %d; body %s", r.status, tc.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); r.status >= 400 && ct != "application/json; charset=utf-8" {
				t.Errorf("error content type %q", ct)
			}
			if r.status >= 400 {
				m := r.json(t)
				if msg, _ := m["error"].(string); msg == "" {
					t.Errorf("error body without message: %s", r.body)
				}
				if got, _ := m["field"].(string); got != tc.field {
					t.Errorf("field = %q, want %q (%s)", got, tc.field, r.body)
				}
			}
			entries := f.auditEntries(t)
			switch {
			case tc.audit == "" && len(entries) != 0:
				t.Errorf("audit entries %v, want none", entries)
			case tc.audit != "":
				if len(entries) != 1 {
					t.Fatalf("audit entries %v, want exactly one", entries)
				}
				e := entries[0]
				if got := fmt.Sprint(e["action"], " ", e["result"]); got != tc.audit {
					t.Errorf("audit = %q, want %q", got, tc.audit)
				}
				if e["who"] != "alice" || e["reason"] == "" || e["target"] == "" || e["time"] != t0.Format(time.RFC3339Nano) {
					t.Errorf("audit entry %v", e)
				}
			}
			if tc.check != nil {
				tc.check(t, f, r)
			}
		})
	}
}

// routePath fills a pattern's wildcards.
func routePath(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	path = strings.ReplaceAll(path, "{id}", "m1")
	path = strings.ReplaceAll(path, "{user}", "u1")
	return method, path
}

func TestAuth(t *testing.T) {
	f := newFixture(t)
	bad := map[string]string{
		"no token":          "",
		"wrong token":       "Bearer wrong-token-0123456789abcdef",
		"prefix of a token": "Bearer " + operatorToken[:len(operatorToken)-1],
		"token plus suffix": "Bearer " + operatorToken + "x",
		"empty bearer":      "Bearer ",
		"scheme only":       "Bearer",
		"basic scheme":      "Basic " + operatorToken,
		"no scheme":         operatorToken,
		"two spaces":        "Bearer  " + operatorToken,
	}
	for _, pattern := range f.srv.Routes() {
		method, path := routePath(pattern)
		for name, auth := range bad {
			t.Run(pattern+"/"+name, func(t *testing.T) {
				r := f.do(t, auth, method, path, `{"reason":"x"}`)
				if r.status != http.StatusUnauthorized {
					t.Fatalf("status %d, want 401", r.status)
				}
				if ch := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer") {
					t.Errorf("WWW-Authenticate = %q", ch)
				}
			})
		}
		write := method != http.MethodGet
		t.Run(pattern+"/viewer", func(t *testing.T) {
			r := f.do(t, vw, method, path, "")
			if write && r.status != http.StatusForbidden {
				t.Errorf("viewer write: status %d, want 403", r.status)
			}
			if !write && (r.status == http.StatusForbidden || r.status == http.StatusUnauthorized) {
				t.Errorf("viewer read: status %d", r.status)
			}
		})
		t.Run(pattern+"/lowercase scheme", func(t *testing.T) {
			if r := f.do(t, "bearer "+operatorToken, method, path, ""); r.status == http.StatusUnauthorized {
				t.Errorf("status 401 for a valid token with a lowercase scheme")
			}
		})
	}
	// Nothing refused above may have reached the store or the audit stream.
	if got := f.dlq.retriedIDs(); len(got) != 0 {
		t.Errorf("refused requests retried %v", got)
	}
	if e := f.auditEntries(t); len(e) != 0 {
		t.Errorf("refused requests audited: %v", e)
	}
	if _, ok := f.rl.block["bad1"]; !ok {
		t.Error("refused unblock went through")
	}
}

func TestAuthenticatorPicksTheMatchingToken(t *testing.T) {
	toks := []config.AdminToken{
		{Name: "a", Token: "aaaaaaaaaaaaaaaa", Role: RoleViewer},
		{Name: "b", Token: "aaaaaaaaaaaaaaab", Role: RoleOperator},
		{Name: "c", Token: "cccccccccccccccccccccccc", Role: RoleViewer},
	}
	a := newAuthenticator(toks)
	for i, tk := range toks {
		if got := a.lookup(tk.Token); got != i {
			t.Errorf("lookup(%s) = %d, want %d", tk.Name, got, i)
		}
	}
	for _, s := range []string{"", "aaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaa", "cccccccccccccccccccccccC"} {
		if got := a.lookup(s); got != -1 {
			t.Errorf("lookup(%q) = %d, want -1", s, got)
		}
	}
}

func TestConsoleIsServedWithoutToken(t *testing.T) {
	f := newFixture(t)
	for path, want := range map[string]string{
		"/admin/ui/":         "<title>kfpipe admin</title>",
		"/admin/ui/app.js":   "sessionStorage",
		"/admin/ui/app.css":  "font-family",
		"/admin/ui/nope.txt": "404",
	} {
		r := f.do(t, "", "GET", path, "")
		if !strings.Contains(string(r.body), want) {
			t.Errorf("%s: status %d body %.80q, want %q", path, r.status, r.body, want)
		}
		if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	req, _ := http.NewRequest("GET", f.http.URL+"/admin/ui", nil)
	resp, err := f.http.Client().Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/admin/ui/" {
		t.Errorf("/admin/ui: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}
