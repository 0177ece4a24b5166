package console

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// batchFixture serves n letters of 10 users (user i%10, source offsets in
// order) on rdb under prefix, batches at rate letters a second.
func batchFixture(t *testing.T, d *memDLQ, rate int, prefix string) *fixture {
	t.Helper()
	rdb, p := testenv.Redis(t)
	if prefix == "" {
		prefix = p
	}
	f := &fixture{dlq: d, rl: newMemRL(t0), rdb: rdb, prefix: prefix}
	return f.start(t, Config{BatchRate: rate})
}

func reviewLetters(n int) *memDLQ {
	var msgs []DLQMessage
	for i := range n {
		msgs = append(msgs, DLQMessage{ID: fmt.Sprintf("m%04d", i), User: fmt.Sprintf("u%d", i%10), Reason: "downstream_error",
			State: "review", FailureTime: t0, SourceOffset: int64(i)})
	}
	slices.Reverse(msgs) // newest first, as the index lists them
	return newMemDLQ(t0, msgs...)
}

func plan(t *testing.T, r response) BatchPlan {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("batch write: %d %s", r.status, r.body)
	}
	var p BatchPlan
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBatchRetryDryRunMatchesTheBatch: the dry run counts the letters,
// their users and those already done; the batch then retries exactly the
// counted ones, skips the done ones, in their messages' order, and says so
// in its progress.
func TestBatchRetryDryRunMatchesTheBatch(t *testing.T) {
	d := reviewLetters(300)
	for i := 0; i < 300; i += 7 {
		d.done[fmt.Sprintf("m%04d", i)] = true
	}
	f := batchFixture(t, d, 1000, "")
	op := "Bearer " + operatorToken
	dry := plan(t, f.do(t, op, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"fixed","dry_run":true}`))
	if dry.Selected != 300 || dry.AlreadyDone != 43 || dry.Count != 257 || dry.Users != 10 || len(dry.TopUsers) != 10 || dry.Batch != nil {
		t.Fatalf("dry run %+v, want 300 selected, 43 done, 257 to retry, 10 users, no batch", dry)
	}
	if ids := d.retriedIDs(); len(ids) != 0 {
		t.Fatalf("dry run retried %d letters", len(ids))
	}
	r := f.do(t, op, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"fixed"}`)
	if p := plan(t, r); p.Count != dry.Count || p.Batch == nil || p.Batch.Total != dry.Count {
		t.Fatalf("batch answer %+v, want count %d and a batch of as many", p, dry.Count)
	}
	b := f.waitBatch(t, r)
	if b.State != BatchDone || b.Acted != dry.Count || b.SkippedDone != 0 || b.Position != dry.Count || b.Who != "alice" {
		t.Fatalf("batch ended %+v, want done, %d retried, none skipped (the done ones were never in it)", b, dry.Count)
	}
	ids := d.retriedIDs()
	if len(ids) != dry.Count {
		t.Fatalf("%d letters retried, the dry run said %d", len(ids), dry.Count)
	}
	if !slices.IsSorted(ids) {
		t.Errorf("letters retried out of their messages' order: %v…", ids[:10])
	}
	for _, id := range ids {
		if d.done[id] {
			t.Errorf("letter %s retried though its message is done", id)
		}
	}
}

// TestBatchIsPacedAndCancellable: at 50 letters a second a batch of 200
// is still running after half a second with about 25 done; a cancel stops
// it there, and nothing more is retried afterwards.
func TestBatchIsPacedAndCancellable(t *testing.T) {
	d := reviewLetters(200)
	f := batchFixture(t, d, 50, "")
	op := "Bearer " + operatorToken
	r := f.do(t, op, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"slowly"}`)
	id := plan(t, r).Batch.ID
	time.Sleep(500 * time.Millisecond)
	if n := len(d.retriedIDs()); n < 5 || n > 60 {
		t.Fatalf("%d letters retried in 0.5 s at 50/s", n)
	}
	if c := f.do(t, op, "POST", "/admin/dlq/batches/"+id+"/cancel", `{"reason":"wrong filter"}`); c.status != 200 {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	b := f.waitBatch(t, r)
	if b.State != BatchCancelled || b.CancelledBy != "alice" || b.Acted >= 200 {
		t.Fatalf("batch %+v, want cancelled by alice midway", b)
	}
	n := len(d.retriedIDs())
	time.Sleep(300 * time.Millisecond)
	if m := len(d.retriedIDs()); m != n || m != b.Acted {
		t.Fatalf("retried %d at the cancel, %d later, batch says %d", n, m, b.Acted)
	}
	if c := f.do(t, op, "POST", "/admin/dlq/batches/"+id+"/cancel", `{"reason":"again"}`); c.status != 409 {
		t.Fatalf("cancelling an ended batch: %d, want 409", c.status)
	}
	if c := f.do(t, "Bearer "+viewerToken, "POST", "/admin/dlq/batches/"+id+"/cancel", `{"reason":"x"}`); c.status != 403 {
		t.Fatalf("viewer cancel: %d, want 403", c.status)
	}
	var list batchPage
	if err := json.Unmarshal(f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/batches", "").body, &list); err != nil || len(list.Batches) != 1 || list.Batches[0].ID != id {
		t.Fatalf("batch list %+v (%v)", list, err)
	}
}

// TestBatchResumedByAnotherServer: the server running a batch closes
// midway; another one on the same Redis takes it over and finishes it,
// retrying every letter exactly once.
func TestBatchResumedByAnotherServer(t *testing.T) {
	d := reviewLetters(150)
	a := batchFixture(t, d, 100, "")
	b := batchFixture(t, d, 100, a.prefix)
	r := a.do(t, "Bearer "+operatorToken, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"resume"}`)
	plan(t, r)
	time.Sleep(400 * time.Millisecond)
	_ = a.srv.Close()
	at := len(d.retriedIDs())
	if at == 0 || at >= 150 {
		t.Fatalf("%d letters retried when the first server closed: want midway", at)
	}
	got := b.waitBatch(t, r)
	if got.State != BatchDone || got.Acted != 150 {
		t.Fatalf("batch %+v, want done with 150 retried", got)
	}
	ids := d.retriedIDs()
	if len(ids) != 150 || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != 150 {
		t.Fatalf("%d retries (first at %d): want each of 150 once, in order", len(ids), at)
	}
}

// TestGroups counts a selection by reason and by user.
func TestGroups(t *testing.T) {
	f := newFixture(t)
	r := f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/groups", "")
	var g groupsResponse
	if err := json.Unmarshal(r.body, &g); err != nil || r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if g.Total != 4 || g.Users != 3 || g.ByUser[0].User != "u1" || g.ByUser[0].Count != 2 || g.ByReason[0].Reason != "rate_limited" || g.ByReason[0].Users != 2 {
		t.Fatalf("groups %+v", g)
	}
	r = f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/groups?review=true", "")
	g = groupsResponse{}
	if err := json.Unmarshal(r.body, &g); err != nil || g.Total != 2 || g.Users != 2 {
		t.Fatalf("groups in review: %s", r.body)
	}
	// u1's rate_limited message was processed after all (its dedup mark):
	// its letter is counted apart, not among the letters still to handle.
	f.dlq.done["m1"] = true
	r = f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/groups", "")
	g = groupsResponse{}
	if err := json.Unmarshal(r.body, &g); err != nil || r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	rateLimited := 0
	for _, rg := range g.ByReason {
		if rg.Reason == "rate_limited" {
			rateLimited = rg.Count
		}
	}
	if g.Total != 3 || g.Done != 1 || g.ByUser[0].Count != 1 || rateLimited != 1 {
		t.Fatalf("groups with m1 done %+v, want 3 counted, 1 done apart, u1 with 1, rate_limited of 1 user", g)
	}
}

// TestBatchRetryDryRunCountsThePacing: 300 letters of 10 users at 1000 a
// second take 0.3 s of the batch's own rate, but the DLQ scheduler lets a
// user's retries back at most 15 a minute: each user's 30 letters take a
// minute after the first 15. The dry run says 60 s, not "about 0 s", and
// names the slowest user; a purge is not paced.
func TestBatchRetryDryRunCountsThePacing(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	f := &fixture{dlq: reviewLetters(300), rl: newMemRL(t0), rdb: rdb, prefix: prefix}
	f.start(t, Config{BatchRate: 1000, RetryPace: func() (int, time.Duration, bool) { return 15, time.Minute, true }})
	op := "Bearer " + operatorToken
	dry := plan(t, f.do(t, op, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"fixed","dry_run":true}`))
	if dry.Count != 300 || dry.RateSeconds != 0.3 {
		t.Fatalf("dry run %+v, want 300 letters, 0.3 s at the batch's rate", dry)
	}
	if dry.Pace == nil || dry.Seconds != 60 || dry.Pace.SlowestLetters != 30 || dry.Pace.PacedUsers != 10 || dry.Pace.SlowestUser != "u0" {
		t.Fatalf("dry run %+v pace %+v, want 60 s: u0's 30 letters at 15 a minute, 10 users paced", dry, dry.Pace)
	}
	purge := plan(t, f.do(t, op, "POST", "/admin/dlq/purge", `{"filter":{"review":true},"reason":"gone","dry_run":true}`))
	if purge.Pace != nil || purge.Seconds != 0.3 {
		t.Fatalf("purge dry run %+v, want 0.3 s and no pacing", purge)
	}
}

// TestUnblockSaysWhatStillWaits: u1's rate_limited letter was scheduled
// for an hour on (after its block's end); unblocking u1 does not bring it
// forward, so the answer says one letter still waits, until when, and how
// to retry it now. The letter in review (invalid_message) is not counted.
func TestUnblockSaysWhatStillWaits(t *testing.T) {
	f := newFixture(t)
	f.rl.block["u1"] = time.Hour
	r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/ratelimit/unblock/u1", `{"reason":"appeal"}`)
	if r.status != 200 {
		t.Fatalf("unblock: %d %s", r.status, r.body)
	}
	var ans unblockAnswer
	if err := json.Unmarshal(r.body, &ans); err != nil {
		t.Fatal(err)
	}
	if !ans.OK || ans.WaitingLetters != 1 || ans.WaitingUntil == nil || !ans.WaitingUntil.Equal(t0.Add(time.Hour)) || ans.Retry == "" {
		t.Fatalf("unblock answer %+v, want 1 letter waiting until %v and the retry to send it now", ans, t0.Add(time.Hour))
	}
	if _, ok := f.rl.block["u1"]; ok {
		t.Error("u1 still blocked")
	}
}

// TestBatchCountsDelivered: a retry batch of 20 letters whose last 5 the
// scheduler's pacing holds is not done when all 20 are requeued: it says
// 15 are back in the main topic, 5 wait, and when the next and the last
// is due; once the scheduler lets them go it is done with 20 delivered.
func TestBatchCountsDelivered(t *testing.T) {
	d := reviewLetters(20)
	d.hold = map[string]bool{}
	for i := 15; i < 20; i++ {
		d.hold[fmt.Sprintf("m%04d", i)] = true
	}
	f := batchFixture(t, d, 1000, "")
	r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/dlq/batch-retry", `{"filter":{"review":true},"reason":"fixed"}`)
	id := plan(t, r).Batch.ID
	var b Batch
	testenv.Eventually(t, 10*time.Second, func() error {
		got := f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/batches/"+id, "")
		b = Batch{}
		if err := json.Unmarshal(got.body, &b); err != nil {
			return err
		}
		return testenv.Check(b.Position == 20 && b.Delivered == 15, "batch %+v", b)
	})
	if b.State != BatchRunning || b.Acted != 20 || b.Waiting != 5 || b.NextRetry == nil || b.LastRetry == nil ||
		!b.NextRetry.Equal(t0.Add(15*time.Millisecond)) || !b.LastRetry.Equal(t0.Add(19*time.Millisecond)) {
		t.Fatalf("batch %+v, want running: 20 requeued, 15 back, 5 waiting, due from t0+15ms to t0+19ms", b)
	}
	d.mu.Lock()
	d.hold = nil
	d.mu.Unlock()
	b = f.waitBatch(t, r)
	if b.State != BatchDone || b.Delivered != 20 || b.Waiting != 0 || b.NextRetry != nil {
		t.Fatalf("batch %+v, want done with all 20 back in the topic", b)
	}
}
