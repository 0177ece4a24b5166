package kfpipe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
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
	bin := buildExample(t, "faqbot")
	const kfID = "wk-faqbot"
	e := newE2E(t, kfID)
	fake := e.fake
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
	e.produce(t)
	botA := e.startBot(t, bin, testenv.Name(t, "bot-a"), "FAQBOT_SERVICER=alice")

	want := map[string][]string{
		"u-welcome": {"Welcome!", "We are open"},
		"u-menu":    {"How can we help?"},
		"u-human":   {"Connecting you"},
		"u-echo":    {"You said: hello there"},
	}
	testenv.Eventually(t, 90*time.Second, func() error {
		for user, texts := range want {
			if n := len(fake.Replies(kfID, user)); n < len(texts) {
				return fmt.Errorf("%s got %d replies, want %d", user, n, len(texts))
			}
		}
		n := len(fake.Transfers())
		return testenv.Check(n == 1, "%d hand-offs, want 1", n)
	})
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
	rdb, ctx := e.rdb, context.Background()
	// The done marks: digests in the state store's buckets.
	countMarks := func() (buckets []string, n int64) {
		buckets, err := rdb.Keys(ctx, e.prefix+"st:{*}:d:*").Result()
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
	e.startBot(t, bin, testenv.Name(t, "bot-b"), "FAQBOT_SERVICER=alice")
	testenv.Eventually(t, 90*time.Second, func() error {
		_, n := countMarks()
		return testenv.Check(n == marks, "%d messages handled again (done marks), want %d", n, marks)
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
