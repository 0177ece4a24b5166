package dlq

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// selectSeed replays a failed run of the selection property.
var selectSeed = flag.Int64("dlq.select-seed", 0, "seed of TestRetrySelectionDryRunEqualsAction (0: a new one)")

// letterState is a state a property round puts a letter in.
type letterState int

const (
	stDueLater letterState = iota // due in the future (backoff)
	stDueNow                      // due by now: the scheduler takes it
	stReview                      // in manual review
	stRetried                     // re-injected
	stDone                        // retried and its message done
	stClaimed                     // claimed by a scheduler, being re-injected
	stPurged                      // purged: gone from the index
	stStates
)

// TestRetrySelectionDryRunEqualsAction is the property of the operator's
// retry selection: over random letter sets (users, reasons, states) and
// random retry options, the dry run's verdicts are the real run's, letter
// by letter (so its counts are the acted counts); a letter acted on is
// never selected again — by a second batch, a dry run or the scheduler's
// next claim racing with it — and two batches running at once act on
// each letter at most once between them. Seeded: a failure names its seed.
func TestRetrySelectionDryRunEqualsAction(t *testing.T) {
	testenv.EachRedis(t, eachRetrySelectionDryRunEqualsAction)
}

func eachRetrySelectionDryRunEqualsAction(t *testing.T, rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	seed := *selectSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d (replay: go test -run TestRetrySelectionDryRunEqualsAction -args -dlq.select-seed %d)", seed, seed)
	reasons := []Reason{ReasonDownstreamError, ReasonRateLimited, ReasonUserBlocked, ReasonInvalidMessage, ReasonHandlerRejected, ReasonProcessTimeout}
	const rounds = 60
	for round := range rounds {
		clk := newClock()
		idx := NewIndex(rdb, fmt.Sprintf("%sr%d:", prefix, round), WithClock(clk), WithLetters(mem))
		pol := NewPolicy(testRecovery())
		n := 1 + rng.Intn(30)
		var ids []string
		states := map[string]letterState{}
		var claim []string
		for i := range n {
			user := fmt.Sprintf("u%d", rng.Intn(4))
			dl := deadLetter(user, reasons[rng.Intn(len(reasons))], int64(1000*round+i), clk.Now().Add(-time.Duration(rng.Intn(30))*time.Minute))
			pol.Place(ctx, dl)
			if _, err := indexDL(t, ctx, idx, dl); err != nil {
				t.Fatal(err)
			}
			st := letterState(rng.Intn(int(stStates)))
			states[dl.ID] = st
			ids = append(ids, dl.ID)
			switch st {
			case stDueLater:
				mustNil(t, idx.Requeue(ctx, dl.ID, clk.Now().Add(time.Hour)))
			case stDueNow, stClaimed:
				mustNil(t, idx.Requeue(ctx, dl.ID, clk.Now().Add(-time.Second)))
				if st == stClaimed {
					claim = append(claim, dl.ID)
				}
			case stReview:
				mustNil(t, idx.MoveToReview(ctx, dl.ID))
			case stRetried, stDone:
				if _, err := idx.MarkRetried(ctx, dl.ID, 1); err != nil {
					t.Fatal(err)
				}
				if st == stDone {
					e, _ := idx.Get(ctx, dl.ID)
					if n, err := idx.MarkDone(ctx, []*Entry{e}); err != nil || n != 1 {
						t.Fatalf("mark done: %d %v", n, err)
					}
				}
			case stPurged:
				if _, err := idx.Delete(ctx, dl.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(claim) > 0 {
			// Claimed by a scheduler: only the letters due now are; those
			// meant to be merely due now are made due later meanwhile.
			for id, st := range states {
				if st == stDueNow {
					mustNil(t, idx.reschedule(ctx, id, clk.Now().Add(time.Hour)))
				}
			}
			got, err := idx.claim(ctx, clk.Now(), 1000, time.Minute)
			if err != nil || len(got) != len(claim) {
				t.Fatalf("round %d: claimed %d (%v), want %d", round, len(got), err, len(claim))
			}
			for id, st := range states {
				if st == stDueNow {
					mustNil(t, idx.reschedule(ctx, id, clk.Now().Add(-time.Second)))
				}
			}
		}
		// The request: the letters in random order, with an unknown ID.
		req := slices.Clone(ids)
		rng.Shuffle(len(req), func(i, j int) { req[i], req[j] = req[j], req[i] })
		req = append(req, fmt.Sprintf("nope-%d", round))
		incl := rng.Intn(2) == 0
		batch := fmt.Sprintf("batch-%d", round)

		dry, err := idx.RetrySelected(ctx, req, RetryRequest{DryRun: true, IncludeNotRetryable: incl, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		act, err := idx.RetrySelected(ctx, req, RetryRequest{IncludeNotRetryable: incl, Batch: batch, At: clk.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dry, act) {
			t.Fatalf("round %d (seed %d): dry run %v, real run %v", round, seed, dry, act)
		}
		var acted []string
		for i, v := range act {
			id := req[i]
			want := expectedVerdict(states[id], reasonOf(t, ctx, idx, id), incl)
			if i == len(req)-1 {
				want = VerdictGone
			}
			if v != want {
				t.Fatalf("round %d (seed %d): letter %s in state %d: verdict %v, want %v", round, seed, id, states[id], v, want)
			}
			if v == VerdictRetry {
				acted = append(acted, id)
			}
		}
		// Acted on: never selected again, by another batch or a dry run.
		again, err := idx.RetrySelected(ctx, acted, RetryRequest{DryRun: true, IncludeNotRetryable: true})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range again {
			if v == VerdictRetry {
				t.Fatalf("round %d: letter %s selected again after a retry", round, acted[i])
			}
		}
		// The same batch resumed after a crash counts them as its own.
		resumed, err := idx.RetrySelected(ctx, acted, RetryRequest{IncludeNotRetryable: incl, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range resumed {
			if v != VerdictActed {
				t.Fatalf("round %d: resumed batch: letter %s is %v, want acted", round, acted[i], v)
			}
		}
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func reasonOf(t *testing.T, ctx context.Context, idx *Index, id string) Reason {
	t.Helper()
	es, err := idx.Summaries(ctx, []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if es[0] == nil {
		return ""
	}
	return es[0].Reason
}

// expectedVerdict is the selection's specification, in Go.
func expectedVerdict(st letterState, r Reason, incl bool) Verdict {
	switch {
	case st == stPurged || r == "":
		return VerdictGone
	case st == stRetried || st == stDone:
		return VerdictSettled
	case !incl && !Retryable(r):
		return VerdictNotRetryable
	case st == stDueNow || st == stClaimed:
		return VerdictBusy
	}
	return VerdictRetry
}

// TestRefusedLettersRetriedOnlyWhenIncluded: a letter the handler refused
// for good (handler_rejected) is, like an undecodable one
// (invalid_message), in review and not retried by an operator's retry
// unless it includes non-retryable reasons; with it, both are requeued (a
// refusal may be accepted once the bot is fixed).
func TestRefusedLettersRetriedOnlyWhenIncluded(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	pol := NewPolicy(testRecovery())
	var ids []string
	for i, r := range []Reason{ReasonHandlerRejected, ReasonInvalidMessage} {
		dl := deadLetter("u", r, int64(i), clk.Now())
		pol.Place(ctx, dl)
		if !dl.ManualReview {
			t.Fatalf("%s letter not in review", r)
		}
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, dl.ID)
	}
	for _, dry := range []bool{true, false} {
		vs, err := idx.RetrySelected(ctx, ids, RetryRequest{DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(vs, []Verdict{VerdictNotRetryable, VerdictNotRetryable}) {
			t.Fatalf("retry without including non-retryable reasons (dry run %v): %v, want not_retryable for both", dry, vs)
		}
	}
	vs, err := idx.RetrySelected(ctx, ids, RetryRequest{IncludeNotRetryable: true, At: clk.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vs, []Verdict{VerdictRetry, VerdictRetry}) {
		t.Fatalf("retry including non-retryable reasons: %v, want both retried", vs)
	}
}

// TestRetrySelectionConcurrentBatches: two batches (and a dry run) over the
// same letters at once act on each letter exactly once between them.
func TestRetrySelectionConcurrentBatches(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	pol := NewPolicy(testRecovery())
	var ids []string
	for i := range 200 {
		dl := deadLetter(fmt.Sprintf("u%d", i%7), ReasonDownstreamError, int64(i), clk.Now())
		dl.ManualReview = true
		pol.Place(ctx, dl)
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, dl.ID)
	}
	dry, err := idx.RetrySelected(ctx, ids, RetryRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, v := range dry {
		if v == VerdictRetry {
			want++
		}
	}
	if want != 200 {
		t.Fatalf("dry run would retry %d, want 200", want)
	}
	counts := make([]int, 2)
	var wg sync.WaitGroup
	for b := range 2 {
		wg.Go(func() {
			// In chunks, as batches act, interleaving with the other.
			for lo := 0; lo < len(ids); lo += 10 {
				vs, err := idx.RetrySelected(ctx, ids[lo:lo+10], RetryRequest{Batch: fmt.Sprintf("b%d", b), At: clk.Now().Add(time.Minute)})
				if err != nil {
					t.Error(err)
					return
				}
				for _, v := range vs {
					if v == VerdictRetry {
						counts[b]++
					}
				}
			}
		})
	}
	wg.Wait()
	if counts[0]+counts[1] != want {
		t.Fatalf("two batches retried %d + %d letters, want %d between them", counts[0], counts[1], want)
	}
}

// TestOneLetterPerMessage: a retried message that fails again updates its
// letter (history: failures, first failure, newest reason and record)
// instead of adding one; the older record read again changes nothing; a
// letter whose message is done says so and is never selected again.
func TestOneLetterPerMessage(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	pol := NewPolicy(testRecovery())
	first := clk.Now()
	dl := deadLetter("u1", ReasonDownstreamError, 5, first)
	pol.Place(ctx, dl)
	if res, err := indexDL(t, ctx, idx, dl); err != nil || res != IndexNew {
		t.Fatalf("first letter: %v %v", res, err)
	}
	if _, err := idx.MarkRetried(ctx, dl.ID, 1); err != nil {
		t.Fatal(err)
	}
	// The retry goes back to the main topic and is refused there.
	rec, err := pol.Strategy(dl.Reason).PrepareRetry(dl)
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	again := chatmsg.NewDeadLetter(chatmsg.Source{Topic: "src-main", Partition: 1, Offset: 900, Timestamp: clk.Now(), Key: rec.Key, Value: rec.Value,
		Headers: rec.Headers}, ReasonRateLimited, "over the limit", clk.Now())
	if again.ID != dl.ID || again.RetryCount != 1 {
		t.Fatalf("the retried message's letter is %s (retry %d), want %s (retry 1)", again.ID, again.RetryCount, dl.ID)
	}
	pol.Place(ctx, again)
	if res, err := indexDL(t, ctx, idx, again); err != nil || res != IndexUpdated {
		t.Fatalf("second failure: %v %v, want updated", res, err)
	}
	// The first record read again (a rebuild, a consumer restart): no change.
	if res, err := idx.Index(ctx, dl, Coord{Partition: 0, Offset: 0}); err != nil || res != IndexDuplicate {
		t.Fatalf("older record again: %v %v, want duplicate", res, err)
	}
	st, err := idx.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Total != 1 || st.ByReason["rate_limited"] != 1 || st.ByReason["downstream_error"] != 0 || st.Retried != 0 || st.Due != 1 {
		t.Fatalf("stats %+v, want one due rate_limited letter", st)
	}
	es, _, err := idx.List(ctx, Filter{User: "u1"})
	if err != nil || len(es) != 1 {
		t.Fatalf("u1 has %d letters (%v), want 1", len(es), err)
	}
	e := es[0]
	if e.ID != dl.ID || e.Reason != ReasonRateLimited || e.State != StateDue || e.Failures != 2 || e.RetryCount != 1 ||
		e.FirstFailure == nil || !e.FirstFailure.Equal(first) || !e.FailureTime.Equal(clk.Now()) {
		t.Fatalf("letter %+v (failures %d, first %v), want the second failure's, 2 failures since %v", e.DeadLetter, e.Failures, e.FirstFailure, first)
	}
	if got, err := idx.Get(ctx, dl.ID); err != nil || !got.Whole || got.SourceOffset != 900 {
		t.Fatalf("whole letter %+v %v, want the newest record (source offset 900)", got, err)
	}
	if n, _ := rdb.ZCard(ctx, idx.key("reason", "downstream_error")).Result(); n != 0 {
		t.Fatalf("the letter is still in its old reason's set")
	}
	// Retried again, and this time its message is done.
	if _, err := idx.MarkRetried(ctx, dl.ID, 2); err != nil {
		t.Fatal(err)
	}
	e, _ = idx.Get(ctx, dl.ID)
	if n, err := idx.MarkDone(ctx, []*Entry{e}); err != nil || n != 1 {
		t.Fatalf("mark done: %d %v", n, err)
	}
	if e, _ = idx.Get(ctx, dl.ID); e.State != StateDone {
		t.Fatalf("state %s, want done", e.State)
	}
	if st, _ = idx.Stats(ctx); st.Done != 1 || st.Retried != 0 {
		t.Fatalf("stats %+v, want done 1", st)
	}
	vs, err := idx.RetrySelected(ctx, []string{dl.ID}, RetryRequest{DryRun: true, IncludeNotRetryable: true})
	if err != nil || vs[0] != VerdictSettled {
		t.Fatalf("a done letter's verdict %v (%v), want settled", vs, err)
	}
}
