package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/offsets"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func testOutage() config.Outage {
	return config.Outage{MinUsers: 3, FailureRatio: 0.8, Window: 2 * time.Second, Probes: 1, ProbeInterval: 50 * time.Millisecond}
}

// TestGateOpensOnWidespreadFailures: retryable failures of one user, or
// of many users among successes, leave the gate closed; failures of three
// users with no successes open it; then only one probe at a time passes,
// and its success closes the gate and lets the held callers go.
func TestGateOpensOnWidespreadFailures(t *testing.T) {
	g := newGate(testOutage(), realClock{}, zap.NewNop(), nil)
	for range 10 {
		g.result("u1", false, false, time.Now())
	}
	if g.isOpen() {
		t.Fatal("one failing user opened the gate")
	}
	for i := range 20 {
		g.result(fmt.Sprintf("ok%d", i), true, false, time.Now())
	}
	g.result("u2", false, false, time.Now())
	g.result("u3", false, false, time.Now())
	if g.isOpen() {
		t.Fatal("three failing users among many successes opened the gate")
	}
	g2 := newGate(testOutage(), realClock{}, zap.NewNop(), nil)
	g2.result("u1", false, false, time.Now())
	g2.result("u2", false, false, time.Now())
	if g2.isOpen() {
		t.Fatal("two users opened the gate (min_users 3)")
	}
	g2.result("u3", false, false, time.Now())
	if !g2.isOpen() || g2.detail() == "" {
		t.Fatal("three failing users did not open the gate")
	}
	// Held callers: one probe at a time, after the probe interval.
	var probes, passed atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				probe, ok := g2.hold(context.Background())
				if !ok {
					t.Error("hold ended without a stop")
					return
				}
				if !probe {
					passed.Add(1) // the gate closed
					return
				}
				probes.Add(1)
				g2.result("u9", false, true, time.Now()) // the downstream is still down
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if p := probes.Load(); p < 2 || p > 8 || passed.Load() != 0 {
		t.Fatalf("%d probes in 300 ms at one per 50 ms, %d passed while open", p, passed.Load())
	}
	probe, _ := g2.hold(context.Background())
	for !probe {
		probe, _ = g2.hold(context.Background())
	}
	g2.result("u9", true, true, time.Now()) // the downstream answers again
	wg.Wait()
	if g2.isOpen() || passed.Load() != 20 {
		t.Fatalf("a successful probe did not close the gate and release the held callers (passed %d)", passed.Load())
	}
}

// TestOutageHoldsMessagesInsteadOfDeadLettering: the handler fails for
// every user; with the gate each message waits and is handled once the
// downstream is back — no dead letter; without it (min_users 0) the same
// outage dead-letters them. One user whose handler keeps failing after
// the outage is still dead-lettered.
func TestOutageHoldsMessagesInsteadOfDeadLettering(t *testing.T) {
	for _, withGate := range []bool{true, false} {
		t.Run(fmt.Sprintf("gate=%t", withGate), func(t *testing.T) {
			var down atomic.Bool
			down.Store(true)
			h := HandlerFunc(func(_ context.Context, m *chatmsg.ChatMessage) error {
				if down.Load() || m.ExternalUserID == "broken" {
					return errors.New("503 from the downstream")
				}
				return nil
			})
			dlq := &memDLQ{}
			c, _ := unitConsumer(t, h, dlq, nil)
			cfg := testOutage()
			if !withGate {
				cfg.MinUsers = 0
			}
			c.proc.gate = newGate(cfg, c.clock, zap.NewNop(), nil)
			users := []string{"a", "b", "c", "d", "e", "broken"}
			parts := make([]*partition, len(users))
			var wg sync.WaitGroup
			for i, u := range users {
				parts[i] = &partition{topic: "t", id: int32(i), tracker: offsets.NewTracker(0)}
				parts[i].tracker.Add(0)
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 0}}, msg: chat(u, 0), part: parts[i]})
				}()
			}
			time.Sleep(400 * time.Millisecond) // the outage: many retries' worth
			down.Store(false)
			wg.Wait()
			dlq.wg.Wait()
			got := map[string]bool{}
			for _, l := range dlq.all() {
				got[l.Original.ExternalUserID] = true
			}
			if withGate {
				if len(got) != 1 || !got["broken"] {
					t.Fatalf("dead letters for %v, want only the broken user's", got)
				}
				for i, p := range parts {
					if next, ok := p.tracker.Committable(); !ok || next != 1 {
						t.Fatalf("%s's message not finished", users[i])
					}
				}
				return
			}
			if len(got) < len(users)-1 {
				t.Fatalf("without the gate only %v were dead-lettered: the test's outage is too short to show anything", got)
			}
		})
	}
}

// stepClock is a Clock whose Now moves only when the test says so.
type stepClock struct{ *testenv.Clock }

func (stepClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// TestSuspicionSpentAfterAWindow: two users failing with no other traffic
// make the gate suspect; once a message has waited a whole window for it
// to open in vain, those users' failures no longer do — until another
// user fails, or their failures leave the window and start again.
// Without it a few broken users held one message each per window forever
// (found by chaos dlq-kill9: their letters took minutes to reach review).
func TestSuspicionSpentAfterAWindow(t *testing.T) {
	clock := stepClock{testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	cfg := testOutage()
	cfg.MinUsers = 5
	g := newGate(cfg, clock, zap.NewNop(), nil)
	g.result("u1", false, false, clock.Now())
	g.result("u2", false, false, clock.Now())
	if !g.suspect() {
		t.Fatal("two users failing and nothing else: not suspect")
	}
	g.heldInVain("u1")
	clock.Advance(100 * time.Millisecond)
	g.result("u1", false, false, clock.Now())
	if g.suspect() {
		t.Fatal("still suspect after a message waited a whole window for the same two users")
	}
	g.result("u3", false, false, clock.Now())
	if !g.suspect() {
		t.Fatal("a third user failing did not make the gate suspect again")
	}
	g.heldInVain("u3")
	g.result("u1", true, false, clock.Now()) // u1's downstream answers: u1 is no longer judged
	g.result("u1", false, false, clock.Now())
	g.result("u1", false, false, clock.Now())
	if !g.suspect() {
		t.Fatal("u1 failing again after a success is not taken as new")
	}
	// The failures leave the window: everything judged is forgotten.
	clock.Advance(cfg.Window + time.Second)
	g.result("u2", false, false, clock.Now())
	g.result("u3", false, false, clock.Now())
	if !g.suspect() {
		t.Fatal("users judged a window ago still do not make the gate suspect")
	}
	if g.isOpen() {
		t.Fatal("the gate opened with fewer users than min_users")
	}
}

// TestSuspicionSpentForTheHeldUser: the messages that wait out a
// suspicion are held a whole window, calling nothing, so their users'
// failures are a window old when the wait ends. Those users are judged
// all the same: their next messages, failing at once, go on to the DLQ
// after their attempts instead of each waiting a window again. Before,
// heldInVain judged only users with a failure inside the window — not the
// ones just held — and in chaos recovery-after-fix (phase 2: 200 users
// failing among 1,300 served, the full suite) each failing user had one
// letter every 30 s, and 7 of 20 after 3 minutes.
func TestSuspicionSpentForTheHeldUser(t *testing.T) {
	clock := stepClock{testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	cfg := testOutage()
	cfg.MinUsers = 5
	g := newGate(cfg, clock, zap.NewNop(), nil)
	for _, u := range []string{"u1", "u2"} {
		for range 3 { // a message's attempts
			g.result(u, false, false, clock.Now())
		}
	}
	if !g.suspect() {
		t.Fatal("two users failing and nothing else: not suspect")
	}
	// Each one's message waits the whole window in vain.
	clock.Advance(cfg.Window + time.Millisecond)
	g.heldInVain("u1")
	g.heldInVain("u2")
	// Their next messages fail at once.
	for _, u := range []string{"u1", "u2"} {
		g.result(u, false, false, clock.Now())
		if g.suspect() {
			t.Fatalf("%s's next message found the gate suspect again: its users, held a window, were not judged", u)
		}
	}
}

// TestGateJudgesUsersFailingWhileOthersAreServed: many users' downstream
// fails while it serves the others (chaos recovery-after-fix, phase 2:
// 200 failing users among 1,300 served). Their retries fill the recent
// calls and open the gate; a success — the downstream answering someone
// else meanwhile, or a probe — closes it and judges the failing users:
// their failures no longer open it, so their messages go on to the DLQ
// instead of everyone waiting on them. Users failing anew still open it,
// and a judged user quiet for a window counts again.
func TestGateJudgesUsersFailingWhileOthersAreServed(t *testing.T) {
	clock := stepClock{testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	cfg := testOutage()
	g := newGate(cfg, clock, zap.NewNop(), nil)
	fail := func(users ...string) {
		for _, u := range users {
			for range 3 { // a message's attempts
				g.result(u, false, false, clock.Now())
			}
		}
	}
	probeOK := func(user string) {
		t.Helper()
		clock.Advance(cfg.ProbeInterval)
		if probe, ok := g.hold(context.Background()); !probe || !ok {
			t.Fatalf("no probe from the open gate after its interval (probe %t, ok %t)", probe, ok)
		}
		g.result(user, true, true, clock.Now())
	}
	fail("u1", "u2", "u3")
	if !g.isOpen() {
		t.Fatal("three users failing and nothing else did not open the gate")
	}
	g.result("served", true, false, clock.Now()) // answered while the others failed
	if g.isOpen() {
		t.Fatal("a success while open did not close the gate")
	}
	clock.Advance(100 * time.Millisecond)
	fail("u1", "u2", "u3", "u1", "u2", "u3")
	if g.isOpen() {
		t.Fatal("the failures of users judged as their own opened the gate again")
	}
	fail("u4", "u5", "u6")
	if !g.isOpen() {
		t.Fatal("three other users failing did not open the gate")
	}
	probeOK("u9") // a probe of a served user
	if g.isOpen() {
		t.Fatal("a successful probe did not close the gate")
	}
	fail("u4", "u5", "u6")
	if g.isOpen() {
		t.Fatal("users failing while a probe succeeded opened the gate again: it opens and closes at every probe")
	}
	g.result("u4", true, false, clock.Now()) // u4's downstream is back: u4 leaves the judged
	fail("u4", "u7", "u8")
	if !g.isOpen() {
		t.Fatal("u4 failing after its success, with two new users, did not open the gate")
	}
	probeOK("u9")
	// u1..u3 quiet for longer than a window: their next failures count.
	clock.Advance(cfg.Window + time.Second)
	fail("u1", "u2", "u3")
	if !g.isOpen() {
		t.Fatal("users judged more than a window ago, failing again, did not open the gate")
	}
}

// TestGateJudgesUsersFailingBeforeAServedCall: while the gate is closed,
// a call that started after some users' failures and was served shows
// the downstream up: those failures are the users' own, and the gate is
// no longer suspect for them. A call that started before them proves
// nothing (an outage's first failures arrive while older calls still
// succeed). Without it a failing user back after a quiet window was fresh
// again and, with one more, kept the gate suspect for everyone: each of
// their messages out of attempts waited a whole outage.window for a
// verdict (chaos recovery-after-fix, phase 2: 200 failing users among
// 1,300 served had 9 of their 20 letters after 3 minutes).
func TestGateJudgesUsersFailingBeforeAServedCall(t *testing.T) {
	clock := stepClock{testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	cfg := testOutage()
	cfg.MinUsers = 5
	g := newGate(cfg, clock, zap.NewNop(), nil)
	fail := func(users ...string) {
		for _, u := range users {
			for range 3 { // a message's attempts
				g.result(u, false, false, clock.Now())
			}
		}
	}
	before := clock.Now() // a call under way when the failures come
	clock.Advance(10 * time.Millisecond)
	fail("u1", "u2")
	if !g.suspect() {
		t.Fatal("two users failing and nothing else: not suspect")
	}
	clock.Advance(10 * time.Millisecond)
	g.result("served", true, false, before)
	if !g.suspect() {
		t.Fatal("a call that started before the failures and ended after them spent the suspicion: an outage's first messages would go to the DLQ")
	}
	started := clock.Now()
	clock.Advance(10 * time.Millisecond)
	g.result("served", true, false, started)
	if g.suspect() {
		t.Fatal("the downstream served a call that started after two users failed, and the gate is still suspect for them")
	}
	fail("u1", "u2")
	if g.suspect() {
		t.Fatal("users failing while others are served made the gate suspect again")
	}
	fail("u3")
	if !g.suspect() {
		t.Fatal("a new user failing did not make the gate suspect")
	}
	// An outage: nobody is served any more.
	fail("u4", "u5", "u6", "u7")
	if !g.isOpen() {
		t.Fatal("five users failing with nothing served did not open the gate")
	}
}

// TestGateJudgementKeepsItsNewestTime: users judged as of now (their
// messages held a window in vain) are not judged as of their older
// failures again when a served call judges the failing users: their
// verdict would end a window after those failures, and their next
// failures, moments later, found them fresh and the gate suspect again.
func TestGateJudgementKeepsItsNewestTime(t *testing.T) {
	clock := stepClock{testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	cfg := testOutage()
	cfg.MinUsers = 5
	g := newGate(cfg, clock, zap.NewNop(), nil)
	fail := func(users ...string) {
		for _, u := range users {
			for range 3 { // a message's attempts
				g.result(u, false, false, clock.Now())
			}
		}
	}
	fail("u1", "u2")
	clock.Advance(cfg.Window - 100*time.Millisecond)
	g.heldInVain("u1")
	g.heldInVain("u2")
	started := clock.Now()
	clock.Advance(10 * time.Millisecond)
	g.result("served", true, false, started)
	// Past a window after the first failures, within one of the verdict.
	clock.Advance(200 * time.Millisecond)
	fail("u1", "u2")
	if g.suspect() {
		t.Fatal("users held in vain and then judged again by a served call were fresh a moment later: their verdict went back to their older failures")
	}
}
