package kfpipe_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
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
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "handoffbot")
	build := exec.Command("go", "build", "-o", bin, "./handoffbot")
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the examples module: %v\n%s", err, out)
	}
	const kfID = "wk-handoff"
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	defer fake.Close()
	mainTopic, dlqTopic := testenv.Topic(t, 4), testenv.Name(t, "dlq")
	produced := 0
	produce := func() { // what the fake's log holds beyond what was produced
		t.Helper()
		var recs []testenv.Record
		msgs := fake.Messages(kfID)
		for i, m := range msgs[produced:] {
			c := m
			c.MessageID, c.ProducedAt = int64(produced+i+1), time.Now().UnixMilli()
			v, err := chatmsg.Encode(c)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, testenv.Record{Key: []byte(c.ExternalUserID), Value: v, Headers: c.Headers()})
		}
		produced = len(msgs)
		testenv.Produce(t, brokers, mainTopic, recs)
	}
	// seen: the message is marked done in the state store.
	seen := func(msgid string) bool {
		return markedDone(ctx, rdb, prefix, (&chatmsg.ChatMessage{OpenKfID: kfID, UpstreamMsgID: msgid}).DedupKey())
	}

	cmd := exec.Command(bin, "--config", filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	cmd.Env = append(os.Environ(),
		"KFPIPE_KAFKA_BROKERS="+brokers, "KFPIPE_KAFKA_TOPICS_MAIN_NAME="+mainTopic,
		"KFPIPE_KAFKA_TOPICS_DLQ_NAME="+dlqTopic, "KFPIPE_KAFKA_CONSUMER_GROUP_ID="+testenv.Name(t, "handoff"),
		"KFPIPE_REDIS_ADDR="+redisAddr, "KFPIPE_REDIS_KEY_PREFIX="+prefix,
		"KFPIPE_WECOM_BASE_URL="+fake.URL(), "KFPIPE_WECOM_CORP_ID="+fake.CorpID(), "KFPIPE_WECOM_SECRET="+fake.Secret(),
		"KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(t.TempDir(), "emergency.jsonl"), "KFPIPE_OPS_ADDR=127.0.0.1:0",
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP=whitelist", "HANDOFFBOT_SERVICER=alice")
	logf, err := os.Create(filepath.Join(t.TempDir(), "handoffbot.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("handoffbot log:\n%s", b)
		}
	})

	// The photo, then a message while alice serves.
	// A 3,000-byte photo: the bot's thank-you gives its size, read from
	// the media store (kfpipe.OpenMedia), so the photo was kept there
	// before the handler ran.
	fake.AddImage(kfID, "u-photo", bytes.Repeat([]byte{0xff}, 3000))
	quiet := fake.AddText(kfID, "u-photo", "hello? did you get it?")
	// A customer the bot answered, so its state is cached.
	fake.AddText(kfID, "u-race", "hi")
	produce()
	waitUntil(t, 90*time.Second, "the photo handed over and u-race answered", func() bool {
		return len(fake.Replies(kfID, "u-photo")) >= 2 && len(fake.Replies(kfID, "u-race")) == 1 && seen(quiet)
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
	produce()
	waitUntil(t, 60*time.Second, "u-race's refused reply recorded as skipped", func() bool {
		return rdb.Get(ctx, prefix+"replyskip:"+kfID+":"+refused).Val() == "servicer_session"
	})
	// The event arrives; the next message finds the bot quiet.
	fake.ServicerTakes(kfID, "u-race", "alice")
	last := fake.AddText(kfID, "u-race", "ok, thanks")
	produce()
	waitUntil(t, 60*time.Second, "u-race's last message handled", func() bool { return seen(last) })
	time.Sleep(2 * time.Second)
	if rs := fake.Replies(kfID, "u-race"); len(rs) != 1 {
		t.Fatalf("u-race got %d replies, want only the first (the bot is quiet while alice serves)", len(rs))
	}
	if d := fake.DuplicateMsgIDs(); d != 0 {
		t.Fatalf("%d replies reached WeChat a second time", d)
	}
	if letters := testenv.ReadTopic(t, brokers, dlqTopic); len(letters) != 0 {
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
