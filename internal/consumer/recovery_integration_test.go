package consumer

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// recoveryRig is one consumer on real Kafka and Redis with the shipped
// limiter (group as given) and breaker, a handler that fails for users in
// broken, and the delivered messages' order per user.
type recoveryRig struct {
	topic  string
	dlq    *memDLQ
	rl     *ratelimit.Limiter
	br     *ratelimit.Breakers
	broken sync.Map // user → true: the handler answers an error

	mu        sync.Mutex
	delivered map[string][]string // user → upstream IDs in delivery order
	effects   atomic.Int64
}

func newRecoveryRig(t *testing.T, group string) *recoveryRig {
	t.Helper()
	r := &recoveryRig{topic: testenv.Topic(t, 1), dlq: &memDLQ{}, delivered: map[string][]string{}}
	rdb, prefix := testenv.Redis(t)
	rlc := config.DefaultRateLimit()
	rlc.DefaultGroup = group
	rl, err := ratelimit.New(rlc, ratelimit.NewStore(rdb, prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Close() })
	br, err := ratelimit.NewBreakers(config.Breaker{FailureThreshold: 100, OpenTimeout: 30 * time.Second, HalfOpenMax: 5})
	if err != nil {
		t.Fatal(err)
	}
	r.rl, r.br = rl, br
	h := HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if _, bad := r.broken.Load(m.ExternalUserID); bad {
			return fmt.Errorf("receiver answered 500 for %s", m.ExternalUserID)
		}
		r.mu.Lock()
		r.delivered[m.ExternalUserID] = append(r.delivered[m.ExternalUserID], m.UpstreamMsgID)
		r.mu.Unlock()
		r.effects.Add(1)
		return nil
	})
	cfg := testConfig(t, r.topic)
	// The user's actor (and with it the limiter's window) stays for the
	// whole test, as it does for a user who keeps chatting: the window of
	// the first delivery is the one a recovery meets.
	cfg.Processor.IdleTimeout = time.Minute
	startConsumer(t, cfg, h, r.dlq, WithLimiter(rlLimiter{rl}), WithBreaker(br),
		WithState(&redisState{rdb: rdb, prefix: prefix, lease: 30 * time.Second}))
	return r
}

// send produces messages of user with the given send times (the producer's
// headers, send_time included).
func (r *recoveryRig) send(t *testing.T, user string, sent []time.Time) []string {
	t.Helper()
	recs := make([]testenv.Record, len(sent))
	ids := make([]string, len(sent))
	for i, at := range sent {
		m := &chatmsg.ChatMessage{MessageID: int64(i + 1), UpstreamMsgID: fmt.Sprintf("%s-%03d", user, i), OpenKfID: "wk-rec",
			ExternalUserID: user, MsgType: "text", SendTime: at.Unix(), ProducedAt: time.Now().UnixMilli(),
			Content: []byte(`{"text":"hi"}`)}
		v, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = testenv.Record{Key: []byte(user), Value: v, Headers: m.Headers()}
		ids[i] = m.UpstreamMsgID
	}
	testenv.Produce(t, testenv.KafkaBrokers(t), r.topic, recs)
	return ids
}

// reinject puts letters back on the main topic in their original order, in
// quick succession, as the DLQ scheduler does (dlq's PrepareRetry): the
// original record with its own headers, send_time included, plus
// retry_from_dlq, retry_count and original_failure.
func (r *recoveryRig) reinject(t *testing.T, letters []*chatmsg.DeadLetter) {
	t.Helper()
	sort.Slice(letters, func(i, j int) bool { return letters[i].SourceOffset < letters[j].SourceOffset })
	recs := make([]testenv.Record, len(letters))
	for i, dl := range letters {
		var hs [][2]string
		for _, h := range dl.OriginalHeaders {
			switch h.Key {
			case chatmsg.HeaderRetryFromDLQ, chatmsg.HeaderRetryCount, chatmsg.HeaderOriginalFailure:
				continue
			}
			hs = append(hs, [2]string{h.Key, string(h.Value)})
		}
		hs = append(hs, [2]string{chatmsg.HeaderRetryFromDLQ, "true"}, [2]string{chatmsg.HeaderRetryCount, strconv.Itoa(1)},
			[2]string{chatmsg.HeaderOriginalFailure, string(dl.Reason)})
		recs[i] = testenv.Record{Key: dl.OriginalKey, Value: dl.OriginalValue, Headers: hs}
	}
	testenv.Produce(t, testenv.KafkaBrokers(t), r.topic, recs)
}

// lettersOf returns the dead letters of user (reason "" = any).
func (r *recoveryRig) lettersOf(user, reason string) []*chatmsg.DeadLetter {
	var out []*chatmsg.DeadLetter
	for _, dl := range r.dlq.all() {
		if dl.UserID == user && (reason == "" || string(dl.Reason) == reason) {
			out = append(out, dl)
		}
	}
	return out
}

func (r *recoveryRig) deliveredTo(user string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.delivered[user]...)
}

// waitSettled waits until every one of n messages sent had an effect or
// became a dead letter.
func (r *recoveryRig) waitSettled(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		effects, letters := int(r.effects.Load()), len(r.dlq.all())
		return testenv.Check(effects+letters == n, "%d effects and %d dead letters, want %d in all", effects, letters, n)
	})
}

// waitDeliveredOrLettered waits until user has delivered messages, or
// until there are more than letters dead letters (a wrong refusal, which
// the caller then reports).
func (r *recoveryRig) waitDeliveredOrLettered(t *testing.T, user string, delivered, letters int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		d, l := len(r.deliveredTo(user)), len(r.dlq.all())
		return testenv.Check(d == delivered || l > letters, "%d delivered to %s and %d dead letters, want %d delivered", d, user, l, delivered)
	})
}

// TestRecoveredLettersDoNotBlockTheUser is the field run of issue 29: the
// receiver answers 500 for one user's 20 messages (sent one every 3 s, well
// inside any group), they become downstream_error letters, the receiver is
// fixed and all 20 come back within a moment. Every one is delivered, in
// order, once; nothing is refused and the user is not blocked — under the
// shipped group and under the seed's. Before, the limiter judged each
// re-injected letter at its old send time, counted as the newest one in the
// window the first delivery had filled: under seed 1 delivered,
// 3 rate_limited, 16 user_blocked and the user blocked for an hour (the field
// run's figures); under normal 10 delivered.
func TestRecoveredLettersDoNotBlockTheUser(t *testing.T) {
	for _, group := range []string{"normal", "seed"} {
		t.Run(group, func(t *testing.T) {
			r := newRecoveryRig(t, group)
			user := "rec-" + group
			r.broken.Store(user, true)
			start := time.Now().Add(-2 * time.Minute)
			var sent []time.Time
			for i := range 20 {
				sent = append(sent, start.Add(time.Duration(i)*3*time.Second))
			}
			ids := r.send(t, user, sent)
			testenv.Eventually(t, 30*time.Second, func() error {
				n := len(r.lettersOf(user, ReasonDownstreamError))
				return testenv.Check(n == 20, "%d downstream_error letters, want 20", n)
			})
			if n := len(r.dlq.all()); n != 20 {
				t.Fatalf("first delivery: %d dead letters %v, want the 20 downstream_error", n, r.dlq.byReason())
			}

			r.broken.Delete(user) // the receiver is fixed
			r.reinject(t, r.lettersOf(user, ""))
			r.waitDeliveredOrLettered(t, user, 20, 20)
			time.Sleep(200 * time.Millisecond) // anything more would show now
			if n := len(r.dlq.all()); n != 20 {
				t.Fatalf("the recovery made %d new dead letters: %v", n-20, r.dlq.byReason())
			}
			if got := r.deliveredTo(user); fmt.Sprint(got) != fmt.Sprint(ids) {
				t.Fatalf("delivered %v\nwant %v", got, ids)
			}
			if d := r.rl.Allow(context.Background(), user, time.Now()); !d.Allowed {
				t.Fatalf("after the recovery the user's next message is refused: %+v", d)
			}
			if s := r.br.State(user); s != ratelimit.StateClosed {
				t.Fatalf("breaker %s after the recovery", s)
			}
		})
	}
}

// TestRetriedFloodOfABlockedBotIsRefusedAgain (hostile): a bot floods 100
// messages within 2 s; the shipped rule passes 30 and blocks it. An
// operator retries every refused letter at once: each is judged again at its
// re-injection time, the bot is still blocked, and every one is refused
// again (user_blocked) — the recovery path is no way around the limiter.
func TestRetriedFloodOfABlockedBotIsRefusedAgain(t *testing.T) {
	r := newRecoveryRig(t, "normal")
	bot := "rec-bot"
	now := time.Now()
	var sent []time.Time
	for i := range 100 {
		sent = append(sent, now.Add(time.Duration(i)*20*time.Millisecond))
	}
	r.send(t, bot, sent)
	r.waitSettled(t, 100)
	refused := r.lettersOf(bot, "")
	if n := len(r.deliveredTo(bot)); n != 30 || len(refused) != 70 {
		t.Fatalf("the flood: %d delivered, letters %v; want 30 and 70", n, r.dlq.byReason())
	}
	st := r.dlq.byReason()
	if st[ReasonRateLimited] != 20 || st[ReasonUserBlocked] != 50 {
		t.Fatalf("the flood's letters %v, want 20 rate_limited and 50 user_blocked", st)
	}

	r.reinject(t, refused)
	testenv.Eventually(t, 30*time.Second, func() error {
		letters, effects := len(r.dlq.all()), r.effects.Load()
		return testenv.Check(letters >= 140 || effects > 30, "%d dead letters and %d effects, want 140 letters (or an effect more than 30)", letters, effects)
	})
	time.Sleep(200 * time.Millisecond)
	if n := r.effects.Load(); n != 30 {
		t.Fatalf("the retried flood had %d effects more", n-30)
	}
	again := r.dlq.all()[70:]
	for _, dl := range again {
		if string(dl.Reason) != ReasonUserBlocked {
			t.Fatalf("a retried letter of the blocked bot was refused as %s (%s), want user_blocked", dl.Reason, dl.Details)
		}
	}
	if len(again) != 70 {
		t.Fatalf("%d of the 70 retried letters refused again", len(again))
	}
}

// TestRefusedLetterJudgedAtItsReinjection: a person over the seed's rule has
// two messages refused (rate_limited: violations 2 of 3, no block). A
// minute later they are retried: judged at their re-injection time, the
// window has drained and both are delivered; the user is not blocked.
// Before, they were judged at their send time, counted as the newest in the
// still-full window: refused again, the third violation blocked the user for
// an hour.
func TestRefusedLetterJudgedAtItsReinjection(t *testing.T) {
	r := newRecoveryRig(t, "seed")
	user := "rec-person"
	start := time.Now().Add(-time.Minute)
	var sent []time.Time
	for i := range 7 {
		sent = append(sent, start.Add(time.Duration(i)*100*time.Millisecond))
	}
	ids := r.send(t, user, sent)
	r.waitSettled(t, 7)
	refused := r.lettersOf(user, ReasonRateLimited)
	if len(refused) != 2 || len(r.dlq.all()) != 2 {
		t.Fatalf("letters %v, want 2 rate_limited", r.dlq.byReason())
	}
	r.reinject(t, refused)
	r.waitDeliveredOrLettered(t, user, 7, 2)
	if n := len(r.dlq.all()); n != 2 {
		t.Fatalf("the retry made %d new dead letters: %v", n-2, r.dlq.byReason())
	}
	if got := r.deliveredTo(user); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("delivered %v\nwant %v", got, ids)
	}
}
