package dlq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func testRecovery() config.Recovery {
	return config.Recovery{BaseDelay: time.Minute, MaxDelay: time.Hour, ScanInterval: 20 * time.Millisecond,
		MaxRetries: map[string]int{"rate_limited": 5, "user_blocked": 3, "circuit_open": 5, "queue_full": 5,
			"downstream_error": 5, "process_timeout": 5, "invalid_message": 0},
		TTL: map[string]time.Duration{"rate_limited": time.Hour}, DefaultTTL: 24 * time.Hour, LockTTL: time.Second}
}

// testIndex is an index on rdb under prefix at clk's time, its letters in
// mem.
func testIndex(rdb redis.UniversalClient, prefix string, clk Clock) *Index {
	return NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
}

// indexRig is a test's index on rdb under prefix, the manual clock it
// reads and the placement policy of testRecovery.
func indexRig(rdb redis.UniversalClient, prefix string) (*manualClock, *Index, *Policy) {
	clk := newClock()
	return clk, testIndex(rdb, prefix, clk), NewPolicy(testRecovery())
}

// placeIndexed places each letter with pol and indexes it; an indexing
// error fails the test.
func placeIndexed(t testing.TB, ctx context.Context, idx *Index, pol *Policy, dls ...*chatmsg.DeadLetter) {
	t.Helper()
	for _, dl := range dls {
		pol.Place(ctx, dl)
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatalf("index %s: %v", dl.ID, err)
		}
	}
}

func TestIndexIdempotent(t *testing.T) { testenv.EachRedis(t, eachIndexIdempotent) }

func eachIndexIdempotent(t *testing.T, rdb redis.UniversalClient, prefix string) {
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("u1", ReasonRateLimited, 7, clk.Now())
	pol.Place(ctx, dl)
	if res, err := indexDL(t, ctx, idx, dl); err != nil || res != IndexNew {
		t.Fatalf("first index: %v %v", res, err)
	}
	before, _ := idx.Stats(ctx)
	// The same source record dead-lettered again (consumer crash before
	// commit) and the same record re-read from the topic.
	again := deadLetter("u1", ReasonRateLimited, 7, clk.Now().Add(time.Second))
	pol.Place(ctx, again)
	for _, d := range []*chatmsg.DeadLetter{dl, again} {
		if res, err := indexDL(t, ctx, idx, d); err != nil || res != IndexDuplicate {
			t.Fatalf("re-index: %v %v", res, err)
		}
	}
	after, _ := idx.Stats(ctx)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("stats changed on re-index: %+v -> %+v", before, after)
	}
	if after.Total != 1 || after.ByReason["rate_limited"] != 1 || after.Due != 1 || after.Review != 0 {
		t.Fatalf("stats %+v", after)
	}
	// The same retried event twice counts once.
	for range 2 {
		if _, err := idx.MarkRetried(ctx, dl.ID, 1); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := idx.Stats(ctx)
	if s.Retried != 1 || s.Due != 0 {
		t.Fatalf("after retried twice: %+v", s)
	}
	e, err := idx.Get(ctx, dl.ID)
	if err != nil || e.State != StateRetried || e.Attempts != 1 || e.RetriedAt == nil {
		t.Fatalf("entry %+v %v", e, err)
	}
	if _, err := idx.Get(ctx, "nope"); err != ErrNotFound {
		t.Fatalf("missing get: %v", err)
	}
}

func TestIndexListPaginationAndFilters(t *testing.T) {
	testenv.EachRedis(t, eachIndexListPaginationAndFilters)
}

func eachIndexListPaginationAndFilters(t *testing.T, rdb redis.UniversalClient, prefix string) {
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	users := []string{"ann", "ben", "cat"}
	reasons := []Reason{ReasonRateLimited, ReasonInvalidMessage}
	want := map[string]*chatmsg.DeadLetter{}
	for i := range 25 {
		// Several share a failure millisecond, to exercise the cursor's tie break.
		dl := deadLetter(users[i%3], reasons[i%2], int64(i), clk.Now().Add(time.Duration(i/3)*time.Millisecond))
		placeIndexed(t, ctx, idx, pol, dl)
		want[dl.ID] = dl
	}
	yes, no := true, false
	count := func(f Filter) []*Entry {
		t.Helper()
		var all []*Entry
		seen := map[string]bool{}
		f.Limit = 4
		for page := 0; ; page++ {
			es, next, err := idx.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) > 4 || page > 30 {
				t.Fatalf("page of %d (page %d)", len(es), page)
			}
			for _, e := range es {
				if seen[e.ID] {
					t.Fatalf("%s listed twice", e.ID)
				}
				seen[e.ID] = true
				if len(all) > 0 && e.FailureTime.After(all[len(all)-1].FailureTime) {
					t.Fatalf("not newest first")
				}
				all = append(all, e)
			}
			if next == "" {
				return all
			}
			f.Cursor = next
		}
	}
	tests := []struct {
		name string
		f    Filter
		pred func(*chatmsg.DeadLetter) bool
	}{
		{"all", Filter{}, func(*chatmsg.DeadLetter) bool { return true }},
		{"user", Filter{User: "ben"}, func(d *chatmsg.DeadLetter) bool { return d.UserID == "ben" }},
		{"reason", Filter{Reason: "invalid_message"}, func(d *chatmsg.DeadLetter) bool { return d.Reason == ReasonInvalidMessage }},
		{"review", Filter{Review: &yes}, func(d *chatmsg.DeadLetter) bool { return d.ManualReview }},
		{"not review", Filter{Review: &no}, func(d *chatmsg.DeadLetter) bool { return !d.ManualReview }},
		{"user+reason", Filter{User: "ann", Reason: "rate_limited"}, func(d *chatmsg.DeadLetter) bool {
			return d.UserID == "ann" && d.Reason == ReasonRateLimited
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := count(tt.f)
			n := 0
			for _, d := range want {
				if tt.pred(d) {
					n++
				}
			}
			if len(got) != n || n == 0 {
				t.Fatalf("listed %d, want %d", len(got), n)
			}
			for _, e := range got {
				if !tt.pred(want[e.ID]) {
					t.Fatalf("%s does not match", e.ID)
				}
			}
		})
	}
	var exported int
	if err := idx.Export(ctx, Filter{User: "cat"}, func(e *Entry) error {
		if e.Whole {
			exported++
		}
		return nil
	}); err != nil || exported != 8 {
		t.Fatalf("export %d %v", exported, err)
	}
	if _, _, err := idx.List(ctx, Filter{Cursor: "garbage"}); err == nil {
		t.Fatal("bad cursor accepted")
	}
	// A limit purges that many, newest first; the rest stay.
	n, err := idx.Purge(ctx, Filter{User: "cat", Limit: 3})
	if err != nil || n != 3 {
		t.Fatalf("purge with limit 3: %d %v", n, err)
	}
	if left, _, _ := idx.List(ctx, Filter{User: "cat"}); len(left) != 5 {
		t.Fatalf("%d left after purging 3 of 8", len(left))
	}
	n, err = idx.Purge(ctx, Filter{User: "cat"})
	if err != nil || n != 5 {
		t.Fatalf("purge %d %v", n, err)
	}
	s, _ := idx.Stats(ctx)
	if s.Total != 17 || s.ByReason["rate_limited"]+s.ByReason["invalid_message"] != 17 || s.Due+s.Review != 17 {
		t.Fatalf("stats after purge %+v", s)
	}
}

func TestPurgeExpiredByReasonTTL(t *testing.T) { testenv.EachRedis(t, eachPurgeExpiredByReasonTTL) }

func eachPurgeExpiredByReasonTTL(t *testing.T, rdb redis.UniversalClient, prefix string) {
	clk, idx, pol := indexRig(rdb, prefix) // rate_limited 1h, others 24h
	ctx := context.Background()
	var short, long []*chatmsg.DeadLetter
	for i := range 6 {
		r := ReasonRateLimited
		if i%2 == 1 {
			r = ReasonDownstreamError
		}
		dl := deadLetter("fay", r, int64(i), clk.Now())
		placeIndexed(t, ctx, idx, pol, dl)
		if r == ReasonRateLimited {
			short = append(short, dl)
		} else {
			long = append(long, dl)
		}
	}
	if n, err := idx.PurgeExpired(ctx, clk.Now().Add(59*time.Minute)); err != nil || n != 0 {
		t.Fatalf("early purge %d %v", n, err)
	}
	n, err := idx.PurgeExpired(ctx, clk.Now().Add(2*time.Hour))
	if err != nil || n != 3 {
		t.Fatalf("purge %d %v", n, err)
	}
	for _, dl := range short {
		if _, err := idx.Get(ctx, dl.ID); err != ErrNotFound {
			t.Errorf("%s still there", dl.ID)
		}
	}
	s, _ := idx.Stats(ctx)
	if s.Total != 3 || s.ByReason["rate_limited"] != 0 || s.ByReason["downstream_error"] != 3 || s.Due != 3 {
		t.Fatalf("stats %+v", s)
	}
	es, _, _ := idx.List(ctx, Filter{Reason: "rate_limited"})
	if len(es) != 0 {
		t.Fatalf("reason set still lists %d", len(es))
	}
	// An already expired dead letter (a rebuild of old records) is not indexed.
	clk.Add(48 * time.Hour)
	old := deadLetter("fay", ReasonDownstreamError, 99, clk.Now().Add(-25*time.Hour))
	pol.Place(ctx, old)
	if res, err := indexDL(t, ctx, idx, old); err != nil || res != IndexExpired {
		t.Fatalf("expired index: %v %v", res, err)
	}
	_ = long
}

func TestPlacement(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	blockedUntil := at.Add(3 * time.Hour)
	pol := NewPolicy(testRecovery(), WithBlockLookup(blockFunc(func(string) (time.Time, bool) { return blockedUntil, true })))
	tests := []struct {
		name       string
		reason     Reason
		retry      int
		wantReview bool
		wantDelay  time.Duration
	}{
		{"first retry after base", ReasonQueueFull, 0, false, time.Minute},
		{"doubles", ReasonQueueFull, 2, false, 4 * time.Minute},
		{"capped at max", ReasonDownstreamError, 4, false, 16 * time.Minute},
		{"exhausted goes to review", ReasonRateLimited, 5, true, 0},
		{"invalid goes to review", ReasonInvalidMessage, 0, true, 0},
		{"handler rejected goes to review", ReasonHandlerRejected, 0, true, 0},
		{"blocked waits for the block", ReasonUserBlocked, 0, false, 3*time.Hour + time.Second},
		{"rate limited, now blocked, waits for the block", ReasonRateLimited, 0, false, 3*time.Hour + time.Second},
		{"unknown reason default retries", Reason("weird"), 2, false, 4 * time.Minute},
		{"unknown reason exhausted", Reason("weird"), DefaultMaxRetries, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := deadLetter("gus", tt.reason, 1, at)
			dl.RetryCount = tt.retry
			pol.Place(ctx, dl)
			if dl.ManualReview != tt.wantReview {
				t.Fatalf("review = %v, want %v", dl.ManualReview, tt.wantReview)
			}
			if !tt.wantReview && dl.NextRetryTime.Sub(at) != tt.wantDelay {
				t.Fatalf("delay %s, want %s", dl.NextRetryTime.Sub(at), tt.wantDelay)
			}
		})
	}
	// The cap: base 1m × 2^10 is capped at max 1h.
	b := pol.Strategy(ReasonDownstreamError).(*backoff)
	if d := b.CalculateRetryDelay(ctx, &chatmsg.DeadLetter{RetryCount: 10}); d != time.Hour {
		t.Fatalf("capped delay %s", d)
	}
	if CalculatePriority("vip", ReasonUserBlocked) != 5 || CalculatePriority("normal", ReasonRateLimited) != 4 ||
		CalculatePriority("vip", ReasonQueueFull) != 8 {
		t.Fatal("priority policy")
	}
}

type blockFunc func(string) (time.Time, bool)

func (f blockFunc) BlockedUntil(_ context.Context, u string) (time.Time, bool, error) {
	t, ok := f(u)
	return t, ok, nil
}

func TestIDStable(t *testing.T) {
	a := deadLetter("h", ReasonQueueFull, 5, time.Now())
	b := deadLetter("h", ReasonDownstreamError, 5, time.Now().Add(time.Hour))
	c := deadLetter("h", ReasonQueueFull, 6, time.Now())
	if a.ID != b.ID || a.ID == c.ID || a.ID != chatmsg.DeadLetterID("src-main", 1, 5) {
		t.Fatalf("ids %s %s %s", a.ID, b.ID, c.ID)
	}
	// retry_count travels in the header of a retried record.
	d := chatmsg.NewDeadLetter(chatmsg.Source{Topic: "m", Value: []byte("not json"), Key: []byte("k"),
		Headers: []chatmsg.Header{{Key: "retry_count", Value: []byte("3")}}}, ReasonInvalidMessage, "", time.Now())
	if d.RetryCount != 3 || d.Original != nil || d.UserID != "k" || d.Recoverable || !d.ManualReview {
		t.Fatalf("%+v", d)
	}
}

// TestIndexFullRefusesNewEntriesOnly: past WithMaxEntries a new entry is
// refused (IndexFull) and nothing is written; a duplicate and an event
// still apply, and a deletion makes room.
func TestIndexFullRefusesNewEntriesOnly(t *testing.T) {
	testenv.EachRedis(t, eachIndexFullRefusesNewEntriesOnly)
}

func eachIndexFullRefusesNewEntriesOnly(t *testing.T, rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem), WithMaxEntries(2))
	pol := NewPolicy(testRecovery())
	var dls []*chatmsg.DeadLetter
	for i := range 3 {
		dl := deadLetter(fmt.Sprintf("u%d", i), ReasonDownstreamError, int64(i), clk.Now())
		pol.Place(ctx, dl)
		dls = append(dls, dl)
	}
	for i, want := range []IndexResult{IndexNew, IndexNew, IndexFull} {
		if res, err := indexDL(t, ctx, idx, dls[i]); err != nil || res != want {
			t.Fatalf("letter %d: %v %v, want %v", i, res, err, want)
		}
	}
	if _, err := idx.Get(ctx, dls[2].ID); err != ErrNotFound {
		t.Fatalf("refused letter: %v, want not found", err)
	}
	if room, err := idx.Room(ctx); err != nil || room {
		t.Fatalf("room %v %v, want none", room, err)
	}
	if res, err := indexDL(t, ctx, idx, dls[0]); err != nil || res != IndexDuplicate {
		t.Fatalf("duplicate: %v %v", res, err)
	}
	if ok, err := idx.MarkRetried(ctx, dls[0].ID, 1); err != nil || !ok {
		t.Fatalf("event on a full index: %v %v", ok, err)
	}
	if _, err := idx.Delete(ctx, dls[1].ID); err != nil {
		t.Fatal(err)
	}
	if res, err := indexDL(t, ctx, idx, dls[2]); err != nil || res != IndexNew {
		t.Fatalf("after a deletion: %v %v", res, err)
	}
}

// TestIndexInflow: letters counted by reason into the bucket of their
// failure time; letters outside the window and other reasons' letters
// are not counted in a bucket they do not belong to.
func TestIndexInflow(t *testing.T) { testenv.EachRedis(t, eachIndexInflow) }

func eachIndexInflow(t *testing.T, rdb redis.UniversalClient, prefix string) {
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	to := clk.Now()
	// Minutes before to: rate_limited at 1, 1, 7 and 90 (outside the
	// hour); invalid_message at 59.
	put := func(i int64, r Reason, minutesAgo int) {
		dl := deadLetter("u", r, i, to.Add(-time.Duration(minutesAgo)*time.Minute+time.Second))
		placeIndexed(t, ctx, idx, pol, dl)
	}
	put(1, ReasonRateLimited, 1)
	put(2, ReasonRateLimited, 1)
	put(3, ReasonRateLimited, 7)
	put(4, ReasonRateLimited, 90)
	put(5, ReasonInvalidMessage, 59)
	got, err := idx.Inflow(ctx, to, 5*time.Minute, 12)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int64{
		string(ReasonRateLimited):    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2},
		string(ReasonInvalidMessage): {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("inflow %v, want %v", got, want)
	}
	if _, err := idx.Inflow(ctx, to, 0, 12); err == nil {
		t.Fatal("a zero step accepted")
	}
}

// TestMovedEventAfterRetryIsStale: the index consumes its own EventMoved
// records after the live index changed. An operator's retry (a move to
// due) whose record arrives after the scheduler re-injected the letter
// must not put it back in due — that re-injected it a second time (found
// by the batch test of 10,500 letters under load). A move recorded after the
// re-injection still applies, and a record without attempts_seen (written
// before the field) applies as before.
func TestMovedEventAfterRetryIsStale(t *testing.T) {
	testenv.EachRedis(t, eachMovedEventAfterRetryIsStale)
}

func eachMovedEventAfterRetryIsStale(t *testing.T, rdb redis.UniversalClient, prefix string) {
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("u1", ReasonDownstreamError, 7, clk.Now())
	placeIndexed(t, ctx, idx, pol, dl)
	// The operator's retry: moved live (attempts 0 at the move) …
	at := clk.Now()
	attempts, err := idx.move(ctx, dl.ID, StateDue, at)
	if err != nil || attempts != 0 {
		t.Fatalf("move: %d %v", attempts, err)
	}
	// … the scheduler re-injects it before the moved record is consumed …
	if _, err := idx.MarkRetried(ctx, dl.ID, 1); err != nil {
		t.Fatal(err)
	}
	// … and then the record arrives.
	zero := 0
	moved := &chatmsg.DeadLetter{ID: dl.ID, Event: EventMoved, Reason: dl.Reason, UserID: dl.UserID, NextRetryTime: &at, AttemptsSeen: &zero}
	if res, err := idx.Index(ctx, moved, Coord{}); err != nil || res != IndexDuplicate {
		t.Fatalf("stale moved record: %v %v, want duplicate", res, err)
	}
	if e, _ := idx.Get(ctx, dl.ID); e.State != StateRetried {
		t.Fatalf("after a stale move the letter is %s, want retried", e.State)
	}
	// A retry after the re-injection (attempts 1 seen) applies.
	one := 1
	moved.AttemptsSeen = &one
	if res, err := idx.Index(ctx, moved, Coord{}); err != nil || res != IndexEvent {
		t.Fatalf("current moved record: %v %v, want applied", res, err)
	}
	if e, _ := idx.Get(ctx, dl.ID); e.State != StateDue {
		t.Fatalf("after a current move the letter is %s, want due", e.State)
	}
	// An old record without attempts_seen applies whatever the attempts.
	if _, err := idx.MarkRetried(ctx, dl.ID, 2); err != nil {
		t.Fatal(err)
	}
	moved.AttemptsSeen = nil
	if res, err := idx.Index(ctx, moved, Coord{}); err != nil || res != IndexEvent {
		t.Fatalf("old moved record: %v %v, want applied", res, err)
	}
}
