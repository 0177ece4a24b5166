package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestSettleMarksRetriedLettersDone: two letters on a real dlq-consumer,
// both retried; the dedup store then holds one message as processed. A
// settle round marks that letter done (the other stays retried, asked
// about again later), and a second round changes nothing.
func TestSettleMarksRetriedLettersDone(t *testing.T) {
	pc := newPlace(t)
	rdb, prefix := pc.rdb, pc.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := pc.dlqConfig(t)
	cfg.Recovery.BaseDelay, cfg.Recovery.MaxDelay = time.Hour, 2*time.Hour
	d := startDLQ(t, ctx, cfg)
	pdlq := cfg.DLQ
	pdlq.EmergencyFile = t.TempDir() + "/feeder.jsonl"
	p, err := dlq.NewProducer(dlq.ProducerConfig{Kafka: cfg.Kafka, DLQ: pdlq})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	sendTime := time.Now().Unix()
	for i := range 2 {
		m := &chatmsg.ChatMessage{MessageID: int64(i), UpstreamMsgID: fmt.Sprintf("up-settle-%d", i), OpenKfID: "wk-s",
			ExternalUserID: "su", MsgType: "text", SendTime: sendTime, Content: []byte(`{}`)}
		b, _ := chatmsg.Encode(m)
		dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: pc.mainTopic, Offset: int64(i), Timestamp: time.Now(), Key: []byte("su"), Value: b},
			dlq.ReasonDownstreamError, "test failure", time.Now())
		ch := make(chan error, 1)
		p.Send(dl, func(err error) { ch <- err })
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
		ids = append(ids, dl.ID)
	}
	sctx, c := context.WithTimeout(ctx, 20*time.Second)
	_ = p.Close(sctx)
	c()
	testenv.Eventually(t, time.Minute, func() error {
		st, err := d.Index.Stats(ctx)
		return testenv.Check(err == nil && st.Total == 2, "both letters indexed: total %d (%v)", st.Total, err)
	})
	for _, id := range ids {
		if _, err := d.Index.MarkRetried(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
	}
	markDone(t, rdb, prefix, chatmsg.ChatMessage{OpenKfID: "wk-s", UpstreamMsgID: "up-settle-0", SendTime: sendTime})
	s := sources.NewDLQStore(d.Index, rdb, prefix)
	later := time.Now().Add(time.Minute)
	if n, err := settle(ctx, d.Index, s, later); err != nil || n != 1 {
		t.Fatalf("settle marked %d (%v), want 1", n, err)
	}
	for i, want := range []string{dlq.StateDone, dlq.StateRetried} {
		if e, err := d.Index.Get(ctx, ids[i]); err != nil || e.State != want {
			t.Fatalf("letter %d: %+v %v, want %s", i, e, err, want)
		}
	}
	if n, err := settle(ctx, d.Index, s, later.Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("second round marked %d (%v), want 0", n, err)
	}
	if st, err := d.Index.Stats(ctx); err != nil || st.Done != 1 || st.Retried != 1 {
		t.Fatalf("stats %+v %v, want 1 done, 1 retried", st, err)
	}
}

// markDone marks msgs done as a schedule-consumer does: in the state
// store, under the lease of a partition.
func markDone(t *testing.T, rdb redis.UniversalClient, prefix string, msgs ...chatmsg.ChatMessage) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := state.New(ctx, state.Config{Client: rdb, KeyPrefix: prefix, Lease: 2 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Acquire(ctx, "main", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	items := make([]state.Item, len(msgs))
	for i, m := range msgs {
		items[i] = state.Item{Key: m.DedupKey(), SendTime: m.SendTime, User: m.ExternalUserID}
	}
	if err := l.Mark(ctx, 0, items); err != nil {
		t.Fatal(err)
	}
}
