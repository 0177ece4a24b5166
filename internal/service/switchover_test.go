package service

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestSwitchOverFromOldStores is the upgrade of a running deployment
// (docs/operations.md, "Switching to the per-partition store"): Redis
// holds what consumers of the old stores left — claims done markers, a
// claim still in force, the leases store's per-user day sets — and the
// topic is read again from the start by the new consumer with the shipped
// dedup.legacy (read). A message an old consumer handled, under either
// store, is not run again; the one an old consumer is still running runs
// only after its claim ran out, once; the rest run once, each user's in
// order.
func TestSwitchOverFromOldStores(t *testing.T) {
	pc := newPlace(t)
	rdb, prefix := pc.rdb, pc.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := pc.consumerConfig(t)
	if cfg.Dedup.Legacy != "read" {
		t.Fatalf("the test assumes the shipped dedup.legacy read, got %q", cfg.Dedup.Legacy)
	}

	sent := time.Now().Add(-time.Hour).Unix()
	var msgs []*chatmsg.ChatMessage
	for u := range 4 {
		for i := range 5 {
			user := fmt.Sprintf("sw-user-%d", u)
			msgs = append(msgs, &chatmsg.ChatMessage{MessageID: int64(len(msgs) + 1), UpstreamMsgID: fmt.Sprintf("%s-%d", user, i),
				OpenKfID: "wk-switch", ExternalUserID: user, MsgType: "text", SendTime: sent + int64(i), ProducedAt: time.Now().UnixMilli()})
		}
	}
	old := sources.DedupPrefix(prefix)
	doneBefore := map[string]bool{}
	// User 0: messages 0-1 done under claims; user 1: messages 0-2 done
	// under leases (FNV-1a 64 digests in the user's day set); user 2:
	// message 0 claimed by a consumer of the old store that still runs
	// (the claim ends in 3 s); user 3: nothing.
	for _, m := range msgs[0:2] {
		rdb.Set(ctx, old+m.DedupKey(), "d:", time.Hour)
		doneBefore[m.UpstreamMsgID] = true
	}
	for _, m := range msgs[5:8] {
		h := fnv.New64a()
		_, _ = h.Write([]byte(m.DedupKey()))
		rdb.SAdd(ctx, fmt.Sprintf("%su:D:%s:%d", old, m.ExternalUserID, m.SendTime/86400), int64(h.Sum64()))
		doneBefore[m.UpstreamMsgID] = true
	}
	held := msgs[10]
	rdb.Set(ctx, old+held.DedupKey(), "p:old-consumer", 3*time.Second)
	// The claim's 3 s run from here, not from the consumer's start: the
	// produce below can take over a second on a loaded machine (a run
	// measured from the start saw the message handled 1.9 s after it).
	claimed := time.Now()
	produceWithHeaders(t, pc.mainTopic, msgs)

	rec := &recorder{byKey: map[string]int{}, order: map[string][]string{}, attempts: map[string]int{}}
	cons, _ := startConsumer(t, ctx, cfg, rec)
	want := len(msgs) - len(doneBefore)
	testenv.Eventually(t, time.Minute, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return testenv.Check(len(rec.byKey) >= want, "%d of the %d messages not done before handled", len(rec.byKey), want)
	})
	heldAt := time.Since(claimed)
	time.Sleep(2 * time.Second) // room for a second effect
	sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
	defer c()
	if err := cons.Close(sctx); err != nil {
		t.Errorf("close: %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, m := range msgs {
		n := rec.byKey[m.UpstreamMsgID]
		switch {
		case doneBefore[m.UpstreamMsgID] && n != 0:
			t.Errorf("%s was handled by a consumer of the old store and ran again (%d times)", m.UpstreamMsgID, n)
		case !doneBefore[m.UpstreamMsgID] && n != 1:
			t.Errorf("%s ran %d times, want once", m.UpstreamMsgID, n)
		}
	}
	if heldAt < 2500*time.Millisecond {
		t.Errorf("the message an old consumer still held ran %s after its claim, before the claim (3 s) ran out", heldAt.Round(time.Millisecond))
	}
	for u, order := range rec.order {
		for i := 1; i < len(order); i++ {
			if order[i] < order[i-1] {
				t.Errorf("%s: handled out of order: %v", u, order)
				break
			}
		}
	}
}
