package kfpipe_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestHandoffBotEndToEnd builds examples/handoffbot and runs it on the real
// broker and Redis against the fake WeChat:
//   - a customer's photo gets a thank-you with its size (read from the
//     media store), a hand-off to alice and WeChat's
//     event message about it (Transfer's msg_code), sent once;
//   - while alice serves, the bot stays quiet;
//   - a customer whose session a servicer took at WeChat after the bot
//     read (and cached) the state: the bot's reply is refused with 95018
//     and recorded as a skipped reply (the customer timeline's key), the
//     message finished, nothing in the DLQ; the session_status_change
//     event then drops the cache and the bot stays quiet.
//
// The photo is in the media store before the handler runs: the bot's
// thank-you gives its size, which it reads from the store.
func TestHandoffBotEndToEnd(t *testing.T) {
	bin := buildExample(t, "handoffbot")
	const kfID = "wk-handoff"
	e := newE2E(t, kfID)
	fake, rdb, prefix, ctx := e.fake, e.rdb, e.prefix, context.Background()
	// seen: the message is marked done in the state store.
	seen := func(msgid string) bool {
		return markedDone(ctx, rdb, prefix, (&chatmsg.ChatMessage{OpenKfID: kfID, UpstreamMsgID: msgid}).DedupKey())
	}
	e.startBot(t, bin, testenv.Name(t, "handoff"), "HANDOFFBOT_SERVICER=alice")

	// The photo, then a message while alice serves.
	// A 3,000-byte photo: the bot's thank-you gives its size, read from
	// the media store (kfpipe.OpenMedia), so the photo was kept there
	// before the handler ran.
	fake.AddImage(kfID, "u-photo", bytes.Repeat([]byte{0xff}, 3000))
	quiet := fake.AddText(kfID, "u-photo", "hello? did you get it?")
	// A customer the bot answered, so its state is cached.
	fake.AddText(kfID, "u-race", "hi")
	e.produce(t)
	testenv.Eventually(t, 90*time.Second, func() error {
		photo, race, quietSeen := len(fake.Replies(kfID, "u-photo")), len(fake.Replies(kfID, "u-race")), seen(quiet)
		return testenv.Check(photo >= 2 && race == 1 && quietSeen,
			"u-photo got %d replies (want 2), u-race %d (want 1), the quiet message handled: %v", photo, race, quietSeen)
	})
	time.Sleep(2 * time.Second) // the quiet message: nothing may arrive
	rs := fake.Replies(kfID, "u-photo")
	if len(rs) != 2 || !strings.Contains(string(rs[0].Body), "Thanks for the photo (3 KB)") || rs[0].OnEvent ||
		!rs[1].OnEvent || !strings.Contains(string(rs[1].Body), "with alice now") {
		t.Fatalf("u-photo got %+v, want the thank-you and the hand-off's event message once", rs)
	}
	if tr := fake.Transfers(); len(tr) != 1 || tr[0].User != "u-photo" || tr[0].To != 3 || tr[0].Servicer != "alice" {
		t.Fatalf("transfers %+v", tr)
	}

	// alice takes u-race at WeChat; the pipeline has not seen the event yet.
	fake.SetSessionState(kfID, "u-race", 3, "alice")
	refused := fake.AddText(kfID, "u-race", "where is my parcel?")
	e.produce(t)
	testenv.Eventually(t, 60*time.Second, func() error {
		v := rdb.Get(ctx, prefix+"replyskip:"+kfID+":"+refused).Val()
		return testenv.Check(v == "servicer_session", "u-race's refused reply recorded as skipped for %q, want servicer_session", v)
	})
	// The event arrives; the next message finds the bot quiet.
	fake.ServicerTakes(kfID, "u-race", "alice")
	last := fake.AddText(kfID, "u-race", "ok, thanks")
	e.produce(t)
	testenv.Eventually(t, 60*time.Second, func() error {
		return testenv.Check(seen(last), "u-race's last message not handled yet")
	})
	time.Sleep(2 * time.Second)
	if rs := fake.Replies(kfID, "u-race"); len(rs) != 1 {
		t.Fatalf("u-race got %d replies, want only the first (the bot is quiet while alice serves)", len(rs))
	}
	if d := fake.DuplicateMsgIDs(); d != 0 {
		t.Fatalf("%d replies reached WeChat a second time", d)
	}
	if letters := testenv.ReadTopic(t, e.brokers, e.dlqTopic); len(letters) != 0 {
		t.Fatalf("%d dead letters, want none", len(letters))
	}
}

// markedDone reports whether the state store under prefix holds key's done
// mark, in any partition's buckets.
func markedDone(ctx context.Context, rdb redis.UniversalClient, prefix, key string) bool {
	buckets, err := rdb.Keys(ctx, prefix+"st:{*}:d:*").Result()
	if err != nil {
		return false
	}
	d := state.Digest(key)
	for _, k := range buckets {
		if rdb.SIsMember(ctx, k, d).Val() {
			return true
		}
	}
	return false
}
