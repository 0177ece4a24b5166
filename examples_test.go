package kfpipe_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// TestFAQBotEndToEnd builds the examples module (its own go.mod: only
// kfpipe's public packages are importable from there) and runs its bot on
// the real broker and Redis against the fake WeChat: enter_session →
// welcome message; "hours" → the answer; "menu" → a menu message; "human"
// → a reply and a hand-off to the servicer; anything else → an echo; a
// servicer's message → nothing. Then
// a second bot in a new consumer group handles every message again (as
// after a lost offset or a re-pull): no reply may reach WeChat a second
// time.
func TestFAQBotEndToEnd(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	_, prefix := testenv.Redis(t)
	bin := filepath.Join(t.TempDir(), "faqbot")
	build := exec.Command("go", "build", "-o", bin, "./faqbot")
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the examples module: %v\n%s", err, out)
	}

	const kfID = "wk-faqbot"
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	defer fake.Close()
	mainTopic, dlqTopic := testenv.Topic(t, 4), testenv.Name(t, "dlq") // the test env's partition count
	fake.AddEvent(kfID, "u-welcome", "enter_session")
	fake.AddText(kfID, "u-welcome", "hours")
	fake.AddText(kfID, "u-menu", "menu")
	fake.AddText(kfID, "u-human", "human")
	fake.AddText(kfID, "u-echo", "hello there")
	// A servicer's own message to the same customer: the bot answers
	// customers only, so u-echo still gets one reply.
	servicerMsg, _ := json.Marshal(map[string]any{"open_kfid": kfID, "external_userid": "u-echo", "origin": 5,
		"servicer_userid": "alice", "msgtype": "text", "text": map[string]any{"content": "Hi, I am Alice from support"}})
	fake.Append(kfID, servicerMsg)
	produceLog(t, brokers, mainTopic, fake, kfID)

	start := func(group string) *exec.Cmd {
		cmd := exec.Command(bin, "--config", filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
		cmd.Env = append(os.Environ(),
			"KFPIPE_KAFKA_BROKERS="+brokers, "KFPIPE_KAFKA_TOPICS_MAIN_NAME="+mainTopic,
			"KFPIPE_KAFKA_TOPICS_DLQ_NAME="+dlqTopic, "KFPIPE_KAFKA_CONSUMER_GROUP_ID="+group,
			"KFPIPE_REDIS_ADDR="+redisAddr, "KFPIPE_REDIS_KEY_PREFIX="+prefix,
			"KFPIPE_WECOM_BASE_URL="+fake.URL(), "KFPIPE_WECOM_CORP_ID="+fake.CorpID(), "KFPIPE_WECOM_SECRET="+fake.Secret(),
			"KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(t.TempDir(), "emergency.jsonl"), "KFPIPE_OPS_ADDR=127.0.0.1:0",
			"KFPIPE_RATE_LIMIT_DEFAULT_GROUP=whitelist", "FAQBOT_SERVICER=alice")
		logf, err := os.Create(filepath.Join(t.TempDir(), group+".log"))
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
				t.Logf("%s log:\n%s", group, b)
			}
		})
		return cmd
	}
	botA := start(testenv.Name(t, "bot-a"))

	want := map[string][]string{
		"u-welcome": {"Welcome!", "We are open"},
		"u-menu":    {"How can we help?"},
		"u-human":   {"Connecting you"},
		"u-echo":    {"You said: hello there"},
	}
	delivered := func() bool {
		for user, texts := range want {
			if len(fake.Replies(kfID, user)) < len(texts) {
				return false
			}
		}
		return len(fake.Transfers()) == 1
	}
	waitUntil(t, 90*time.Second, "every reply and the hand-off", delivered)
	check := func(when string) {
		t.Helper()
		for user, texts := range want {
			rs := fake.Replies(kfID, user)
			if len(rs) != len(texts) {
				t.Fatalf("%s: %s got %d replies, want %d: %+v", when, user, len(rs), len(texts), rs)
			}
			for i, r := range rs {
				if !strings.Contains(string(r.Body), texts[i]) {
					t.Fatalf("%s: %s reply %d = %s, want %q", when, user, i, r.Body, texts[i])
				}
			}
		}
		if rs := fake.Replies(kfID, "u-welcome"); !rs[0].OnEvent {
			t.Fatalf("%s: the welcome message was not sent with send_msg_on_event", when)
		}
		if rs := fake.Replies(kfID, "u-menu"); rs[0].MsgType != "msgmenu" {
			t.Fatalf("%s: menu sent as %s", when, rs[0].MsgType)
		}
		tr := fake.Transfers()
		if len(tr) != 1 || tr[0].User != "u-human" || tr[0].To != 3 || tr[0].Servicer != "alice" {
			t.Fatalf("%s: transfers %+v", when, tr)
		}
		if d := fake.DuplicateMsgIDs(); d != 0 {
			t.Fatalf("%s: %d replies reached WeChat a second time", when, d)
		}
	}
	check("first run")

	// Every handler runs again: the messages' done marks are gone (as after
	// a crash between the effects and the marks) and a second consumer group
	// reads the topic from the start. The replies' own marks stop them.
	_ = botA.Process.Signal(syscall.SIGTERM)
	_ = botA.Wait()
	rdb, _ := testenv.Redis(t)
	ctx := context.Background()
	// The done marks: digests in the state store's buckets.
	countMarks := func() (buckets []string, n int64) {
		buckets, err := rdb.Keys(ctx, prefix+"st:{*}:d:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range buckets {
			n += rdb.SCard(ctx, k).Val()
		}
		return buckets, n
	}
	buckets, marks := countMarks()
	if want := int64(len(fake.Messages(kfID))); marks != want {
		t.Fatalf("message done marks %d in %v, want one per message (%d)", marks, buckets, want)
	}
	if err := rdb.Del(ctx, buckets...).Err(); err != nil {
		t.Fatal(err)
	}
	start(testenv.Name(t, "bot-b"))
	waitUntil(t, 90*time.Second, "every message handled again", func() bool {
		_, n := countMarks()
		return n == marks
	})
	check("after every message was handled again")
}

// TestExamplesUnitTests runs the examples module's own tests (faqbot's,
// written with kfpipetest): the examples are a module of their own, which
// go test ./... of this one does not enter.
func TestExamplesUnitTests(t *testing.T) {
	cmd := exec.Command("go", "test", "-count=1", "./...")
	cmd.Dir = "examples"
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test in the examples module: %v\n%s", err, out)
	}
}

// produceLog writes kfID's messages in the fake as kf-producer would:
// keyed by user, chatmsg-encoded with its headers.
func produceLog(t *testing.T, brokers, topic string, fake *wecomtest.Server, kfID string) {
	t.Helper()
	var recs []testenv.Record
	for i, m := range fake.Messages(kfID) {
		c := m
		c.MessageID, c.ProducedAt = int64(i+1), time.Now().UnixMilli()
		v, err := chatmsg.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, testenv.Record{Key: []byte(c.ExternalUserID), Value: v, Headers: c.Headers()})
	}
	testenv.Produce(t, brokers, topic, recs)
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
