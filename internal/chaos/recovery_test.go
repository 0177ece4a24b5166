package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosRecoveryAfterFix is the operator's journey "the downstream was
// broken for some users, it is fixed, their letters come back", with the
// shipped limiter rules and DLQ timings (default group, recovery base and
// max delay, processor retries): nothing of the limiter or the scheduler
// is shortened.
//
//   - Phase 1: the receiver fails for one user, who writes 20 messages
//     as a person does (a message every couple of seconds) while
//     ordinary traffic goes on. Once the 20 are letters, the receiver is
//     fixed and the scheduler brings them back by itself.
//   - Phase 2: the same for many users at once (200 in the full suite).
//   - Phase 3: the same for a few users, but the operator retries their
//     letters with a batch right after the fix.
//   - Hostile: a bot floods during the run and is blocked; the operator
//     retries the bot's letters: the limiter still stops it.
//
// It waits on the shipped 1 min retry delay in every phase: make chaos
// runs it (make test keeps TestRunbookDLQGrowing, the operator's fix and
// retry with the shipped rules, and the consumer's and scheduler's
// TestRecoveredLettersDoNotBlockTheUser and TestSchedulerPacesAUsersRetries).
//
// Judged beyond lost=0 dup=0 reordered=0: every failing user's message
// delivered once, in the user's order where the scheduler alone brings
// them back (phases 1 and 2; recovered_reordered counts all); no failing
// user rate limited or blocked (no such letter, no block at the end); the
// bot still blocked
// and not let through by the retry; the time from each fix to the last
// recovered delivery is reported.
func TestChaosRecoveryAfterFix(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	// Ordinary traffic: few messages per user, well inside any rule.
	// The bot writes two messages a second for as long as the load runs.
	load := Load{Total: 9000, Users: 1500, Rate: 15, MaxPerUser: 12, BotPerMin: 120}
	const phase2Users = 200
	const phase3Users = 20
	// Messages per failing user: 20 each in phases 1 and 3; 5 each for
	// phase 2's 200 users. Their letters are paced by the retry budget
	// (overload.retry_budget): each letter takes processor.retry_attempts-1
	// retries, and a retry beyond the budget (half a retry a first call,
	// and at least budgetFloor a second a consumer) waits in its user's
	// order (overload.retry_floor). 4,000 letters took ~8 minutes (5–8 a second) against the 3
	// minutes the phase allows; 1,000 take about two.
	const perUser = 20
	const phase2PerUser = 5
	perUserOf := map[string]int{"phase1": perUser, "phase2": phase2PerUser, "phase3": perUser}
	const gap = 2500 * time.Millisecond

	var (
		mu       sync.Mutex
		failing  = map[string]string{} // user → phase
		fixedAt  = map[string]time.Time{}
		phaseOf  []string
		botUser  string
		botAfter int // bot deliveries seen right after the operator's retry
	)
	var pp *Pipeline
	// The judge runs before the daemons stop: the blocks at the end are
	// read from the running dlq-consumer.
	judge := func(ev *Evidence, rep *Report) {
		mu.Lock()
		defer mu.Unlock()
		blocked, err := pp.BlockedUsers(context.Background())
		if err != nil {
			rep.Problem("read the blocked users: %v", err)
		}
		judgeRecovery(ev, rep, failing, fixedAt, phaseOf, perUserOf, blocked)
		judgeBot(rep, botUser, botAfter, blocked)
	}
	shippedEnv := map[string]string{
		// The suite's pipelines whitelist everyone; this one runs the
		// shipped default group.
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": shippedDefaultGroup(t),
	}
	dlqEnv := map[string]string{
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": shippedDefaultGroup(t),
		// config/test.yaml shortens these to 1 s … 10 s; the shipped ones.
		"KFPIPE_RECOVERY_BASE_DELAY": shippedRecovery(t).BaseDelay.String(),
		"KFPIPE_RECOVERY_MAX_DELAY":  shippedRecovery(t).MaxDelay.String(),
	}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: time.Millisecond, Judge: judge, ConsumerEnv: shippedEnv, DLQEnv: dlqEnv})
	pp = p
	botUser = p.BotName()

	Run(t, "recovery-after-fix", p, load, 8*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		f := p.feeder
		phase := func(name string, users []string, batch bool) error {
			mu.Lock()
			for _, u := range users {
				failing[u] = name
				p.Sink.FailUser(u)
			}
			phaseOf = append(phaseOf, name)
			mu.Unlock()
			// Each user writes its phase's messages, one every gap: a
			// person in a conversation, not a burst.
			n := perUserOf[name]
			for range n {
				f.appendUsers(ctx, users, func(int, string) string { return p.OpenKfIDs[0] })
				if !Pause(ctx, gap, gap) {
					return ctx.Err()
				}
			}
			if err := waitLetters(ctx, p, users, n, letterWait(len(users)*n, 2)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			at := time.Now()
			mu.Lock()
			for _, u := range users {
				p.Sink.UnfailUser(u)
			}
			fixedAt[name] = at
			mu.Unlock()
			if batch {
				// The operator retries each user's letters.
				total := 0
				for _, u := range users {
					got, err := batchRetry(ctx, p, map[string]any{"user": u})
					if got != n {
						t.Logf("%s: the operator's batch for %s acts on %d letters, not %d", name, u, got, n)
					}
					if err != nil {
						return fmt.Errorf("%s: operator's batch for %s: %w", name, u, err)
					}
					total += got
				}
				mu.Lock()
				rec.Extra(name+"_batch_count", total)
				mu.Unlock()
			}
			// Every message of these users delivered: the scheduler (or
			// the batch) brought them all back.
			return waitDelivered(ctx, p, f, users, 6*time.Minute)
		}
		// The bot floods from the start (Load.BotPerMin); by now it is blocked.
		users := func(prefix string, n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = fmt.Sprintf("%s%03d-%s", prefix, i, p.Prefix[len("chaos-"):len(p.Prefix)-1])
			}
			return out
		}
		for _, ph := range []struct {
			name  string
			users []string
			batch bool
		}{{"phase1", users("rone", 1), false}, {"phase2", users("rmany", phase2Users), false}, {"phase3", users("rbatch", phase3Users), true}} {
			if err := phase(ph.name, ph.users, ph.batch); err != nil {
				return err
			}
		}
		// Hostile: the operator retries the bot's letters.
		if !isBlocked(ctx, p, botUser) {
			rec.Problem("the bot %s was never blocked by the shipped rules", botUser)
			return nil
		}
		before := deliveredTo(p.Sink, botUser)
		n, err := batchRetry(ctx, p, map[string]any{"user": botUser})
		if err != nil {
			return fmt.Errorf("operator's retry of the bot: %w", err)
		}
		rec.Extra("bot_letters_retried", n)
		if !Pause(ctx, 10*time.Second, 10*time.Second) {
			return ctx.Err()
		}
		mu.Lock()
		botAfter = deliveredTo(p.Sink, botUser) - before
		mu.Unlock()
		return nil
	})
}

// judgeRecovery checks the failing users: each message delivered, the
// first deliveries in the user's order, no limiter letter, and reports
// the time from each phase's fix to its last recovered delivery.
func judgeRecovery(ev *Evidence, rep *Report, failing map[string]string, fixedAt map[string]time.Time, phases []string, perUser map[string]int, blockedAtEnd []string) {
	first := map[string]time.Time{}
	for _, d := range ev.Deliveries {
		if at, ok := first[d.MsgID]; !ok || d.At.Before(at) {
			first[d.MsgID] = d.At
		}
	}
	byUser := map[string][]Sent{}
	for _, s := range ev.Sent {
		if _, ok := failing[s.User]; ok {
			byUser[s.User] = append(byUser[s.User], s)
		}
	}
	last := map[string]time.Time{}
	undelivered, reordered, limited, throughDLQ := 0, 0, 0, 0
	strictReordered := 0 // in phases 1 and 2, whose letters only the scheduler brings back
	for u, ss := range byUser {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Index < ss[j].Index })
		if want := perUser[failing[u]]; len(ss) != want {
			rep.Problem("failing user %s sent %d messages, want %d", u, len(ss), want)
		}
		var prev time.Time
		for _, s := range ss {
			if len(ev.DLQ[s.MsgID]) > 0 {
				throughDLQ++
			}
			for _, l := range ev.DLQ[s.MsgID] {
				if l.Reason == "rate_limited" || l.Reason == "user_blocked" {
					limited++
					if limited <= 5 {
						rep.note("recovered letter refused by the limiter: %s of %s: %s", s.MsgID, u, l.Reason)
					}
				}
			}
			at, ok := first[s.MsgID]
			if !ok {
				undelivered++
				if undelivered <= 5 {
					rep.note("never delivered: %s of %s (%s)", s.MsgID, u, failing[u])
				}
				continue
			}
			if at.Before(prev) {
				reordered++
				if failing[u] != "phase3" {
					strictReordered++
				}
				if reordered <= 5 {
					var letters []string
					for _, l := range ev.DLQ[s.MsgID] {
						letters = append(letters, l.Reason+"/"+l.State)
					}
					rep.note("recovered out of order: %s of %s (index %d, first effect %s, previous %s, letters %v)",
						s.MsgID, u, s.Index, at.Format("15:04:05.000"), prev.Format("15:04:05.000"), letters)
				}
			}
			prev = at
			if ph := failing[u]; at.After(last[ph]) {
				last[ph] = at
			}
		}
	}
	rep.Extra("failing_users", len(byUser))
	rep.Extra("recovered_through_dlq", throughDLQ)
	rep.Extra("recovered_undelivered", undelivered)
	rep.Extra("recovered_reordered", reordered)
	rep.Extra("recovered_rate_limited", limited)
	for _, ph := range phases {
		if fx, ok := fixedAt[ph]; ok && !last[ph].IsZero() {
			rep.Extra(ph+"_fix_to_last_delivery", last[ph].Sub(fx).Round(100*time.Millisecond))
		}
	}
	if len(byUser) == 0 {
		rep.Problem("no failing user's message was sent: the scenario proved nothing")
	}
	if throughDLQ == 0 {
		rep.Problem("no failing user's message went through the DLQ: the scenario proved nothing")
	}
	if undelivered > 0 {
		rep.Problem("%d messages of failing users never delivered after the fix", undelivered)
	}
	// A user's letters come back in order when the scheduler alone brings
	// them back (phases 1 and 2), even when some of them failed again
	// before the fix and back off longer than the rest: the scheduler
	// holds a user's newer letter until the older ones are due. Where the
	// operator's batch requeues letters while the scheduler's retries of
	// others are in flight (phase 3), the ones in flight are handled
	// first: I4 lets dead-lettered messages leave the order, and the count
	// is reported, not failed.
	if strictReordered > 0 {
		rep.Problem("%d recovered messages of phases 1 and 2 delivered out of their user's order", strictReordered)
	}
	if limited > 0 {
		rep.Problem("%d letters of failing users refused by the limiter (rate_limited/user_blocked)", limited)
	}
	blocked := 0
	for u := range byUser {
		for _, d := range blockedAtEnd {
			if d == u {
				blocked++
			}
		}
	}
	rep.Extra("blocked", blocked)
	if blocked > 0 {
		rep.Problem("%d failing users blocked at the end: a recovery blocked them", blocked)
	}
}

// judgeBot: the operator's retry of a blocked bot's letters lets nothing
// through while the bot's block holds.
func judgeBot(rep *Report, bot string, after int, blockedAtEnd []string) {
	still := false
	for _, u := range blockedAtEnd {
		if u == bot {
			still = true
		}
	}
	rep.Extra("bot_delivered_after_retry", after)
	rep.Extra("bot_blocked_at_end", still)
	if !still {
		rep.Problem("the bot %s is not blocked at the end", bot)
	}
	if after > 0 {
		rep.Problem("the operator's retry let %d of the blocked bot's messages through", after)
	}
}

// budgetFloor is the retries a second the retry budget lets go with no
// first calls, per consumer (overload.retry_floor's default).
const budgetFloor = 5

// letterWait is how long a phase waits for letters letters of failing
// users with consumers consumers: 3 minutes, or what the retry budget's
// floor needs for their retries (processor.retry_attempts 3: two a
// letter) and one more minute.
func letterWait(letters, consumers int) time.Duration {
	return max(3*time.Minute, time.Duration(2*letters/(budgetFloor*consumers))*time.Second+time.Minute)
}

// waitLetters waits until each user has at least n letters in the DLQ
// index.
func waitLetters(ctx context.Context, p *Pipeline, users []string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pending := append([]string(nil), users...)
	for len(pending) > 0 {
		var still []string
		for _, u := range pending {
			c, err := countLetters(ctx, p, u)
			if err != nil || c < n {
				still = append(still, u)
			}
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			c, _ := countLetters(ctx, p, pending[0])
			return fmt.Errorf("%d users' letters not all in the DLQ after %s (%s has %d of %d)", len(pending), timeout, pending[0], c, n)
		}
		if !Pause(ctx, time.Second, time.Second) {
			return ctx.Err()
		}
	}
	return nil
}

func countLetters(ctx context.Context, p *Pipeline, user string) (int, error) {
	var page struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if err := adminGet(ctx, p, "/admin/dlq/messages?limit=500&user="+url.QueryEscape(user), &page); err != nil {
		return 0, err
	}
	return len(page.Messages), nil
}

// waitDelivered waits until every message the feeder sent for users has an
// effect in the Sink.
func waitDelivered(ctx context.Context, p *Pipeline, f *Feeder, users []string, timeout time.Duration) error {
	want := map[string]bool{}
	for _, u := range users {
		want[u] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		missing := 0
		var example string
		for _, s := range f.Sent() {
			if want[s.User] && !p.Sink.Has(s.MsgID) {
				missing++
				example = s.MsgID + " of " + s.User
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d recovered messages still undelivered %s after the fix (e.g. %s)", missing, timeout, example)
		}
		if !Pause(ctx, time.Second, time.Second) {
			return ctx.Err()
		}
	}
}

// batchRetry is the operator's "Retry all matching…" with filter, and
// returns the count the batch acts on.
func batchRetry(ctx context.Context, p *Pipeline, filter map[string]any) (int, error) {
	body, _ := json.Marshal(map[string]any{"reason": "chaos: downstream fixed", "filter": filter})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.AdminURL+"/admin/dlq/batch-retry", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("batch retry: %s: %s", resp.Status, strings.TrimSpace(b.String()))
	}
	var out struct {
		Count int `json:"count"`
	}
	err = json.Unmarshal(b.Bytes(), &out)
	p.T.Logf("batch retry %v: %s", filter, strings.TrimSpace(b.String()))
	return out.Count, err
}

// isBlocked reports whether the limiter holds a block of user.
func isBlocked(ctx context.Context, p *Pipeline, user string) bool {
	users, err := p.BlockedUsers(ctx)
	if err != nil {
		return false
	}
	for _, u := range users {
		if u == user {
			return true
		}
	}
	return false
}

// adminGet GETs path of the admin API with the operator token into into.
func adminGet(_ context.Context, p *Pipeline, path string, into any) error {
	return getJSON(p.AdminURL+path, into)
}

// deliveredTo counts the Sink's deliveries of user's messages.
func deliveredTo(s *Sink, user string) int {
	n := 0
	for _, d := range s.Deliveries() {
		if d.User == user {
			n++
		}
	}
	return n
}

// BlockedUsers lists every user the limiter holds a block of (the admin
// API's pages, all of them).
func (p *Pipeline) BlockedUsers(ctx context.Context) ([]string, error) {
	var out []string
	cursor := ""
	for {
		var page struct {
			Users []struct {
				User string `json:"user"`
			} `json:"users"`
			NextCursor string `json:"next_cursor"`
		}
		path := "/admin/ratelimit/blocked?limit=500"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		if err := adminGet(ctx, p, path, &page); err != nil {
			return nil, err
		}
		for _, u := range page.Users {
			out = append(out, u.User)
		}
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// shippedDLQConsumer is the dlq-consumer configuration a deployment gets
// from config/production.yaml and the defaults.
func shippedDLQConsumer(t *testing.T) *config.DLQConsumer {
	t.Helper()
	c, err := config.LoadDLQConsumer(filepath.Join(testenv.RepoRoot(t), "config", "production.yaml"))
	if err != nil {
		t.Fatalf("load the shipped configuration: %v", err)
	}
	return c
}

func shippedDefaultGroup(t *testing.T) string { return shippedDLQConsumer(t).RateLimit.DefaultGroup }

func shippedRecovery(t *testing.T) config.Recovery { return shippedDLQConsumer(t).Recovery }
