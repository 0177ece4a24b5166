package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestBacklogJudgedBySendTime: a backlog — 200 ordinary users' 20 messages
// each, sent one every 3 s over the last ten minutes, plus two bots that
// sent 20 messages within 2 s — is read at catch-up speed with the shipped
// group seed as the default (5 in 10 s, 3 violations block for 1 h; the
// shipped normal group lets a burst of 20 through). Only
// the bots may be refused: 5 of each pass, 3 are rate_limited (the third
// blocks) and the other 12 are user_blocked. Before the limiter counted by
// the message's send time it counted by processing time, and every
// ordinary user of a backlog was blocked for an hour.
func TestBacklogJudgedBySendTime(t *testing.T) {
	const users, perUser, bots = 200, 20, 2
	pc := newPlace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cfg := pc.consumerConfig(t)
	cfg.RateLimit.DefaultGroup = "seed"
	if g := cfg.RateLimit.Groups[cfg.RateLimit.DefaultGroup]; !cfg.RateLimit.Enabled || g.MaxMessages != 5 || g.WindowSeconds != 10 {
		t.Fatalf("the test assumes the shipped group seed (5 in 10 s), got %+v", g)
	}

	// The backlog, in each user's send order, keyed by user like kf-producer.
	base := time.Now().Add(-10 * time.Minute)
	var msgs []*chatmsg.ChatMessage
	for i := 0; i < perUser; i++ {
		for u := 0; u < users+bots; u++ {
			user := fmt.Sprintf("bl-user-%03d", u)
			sent := base.Add(time.Duration(i) * 3 * time.Second)
			if u >= users {
				user = fmt.Sprintf("bl-bot-%d", u-users)
				sent = base.Add(time.Duration(i) * 100 * time.Millisecond)
			}
			msgs = append(msgs, &chatmsg.ChatMessage{MessageID: int64(len(msgs) + 1),
				UpstreamMsgID: fmt.Sprintf("%s-%02d", user, i), OpenKfID: "wk-backlog", ExternalUserID: user,
				MsgType: "text", SendTime: sent.Unix(), ProducedAt: time.Now().UnixMilli()})
		}
	}
	produceWithHeaders(t, pc.mainTopic, msgs)

	rec := &recorder{byKey: map[string]int{}, order: map[string][]string{}, attempts: map[string]int{}}
	cons, b := startConsumer(t, ctx, cfg, rec)
	processed := func() map[string]float64 {
		out := map[string]float64{}
		mfs, _ := b.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "kfpipe_messages_processed_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" {
						out[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
		return out
	}
	testenv.Eventually(t, 2*time.Minute, func() error {
		n := 0.0
		for _, v := range processed() {
			n += v
		}
		return testenv.Check(int(n) == len(msgs), "every message handled or dead-lettered: %v of %d", n, len(msgs))
	})
	sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
	defer c()
	if err := cons.Close(sctx); err != nil {
		t.Errorf("close: %v", err)
	}
	got := processed()
	want := map[string]float64{"ok": users*perUser + bots*5, "rate_limited": bots * 3, "user_blocked": bots * 12}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("processed{result=%q} = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for u := 0; u < users; u++ {
		user := fmt.Sprintf("bl-user-%03d", u)
		if n := len(rec.order[user]); n != perUser {
			t.Fatalf("%s: %d of %d messages handled; an ordinary user was refused", user, n, perUser)
		}
	}
}

// produceWithHeaders writes msgs as kf-producer does (key = user, the
// chatmsg headers) and waits for every delivery.
func produceWithHeaders(t *testing.T, topic string, msgs []*chatmsg.ChatMessage) {
	t.Helper()
	testenv.CreateTopic(t, topic, 4)
	recs := make([]testenv.Record, len(msgs))
	for i, m := range msgs {
		v, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = testenv.Record{Key: []byte(m.ExternalUserID), Value: v, Headers: m.Headers()}
	}
	testenv.Produce(t, testenv.KafkaBrokers(t), topic, recs)
}
