package kfpipesim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/kf"
)

// echo answers customers only, and fails on "fail" for good.
var echo = kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
	if !m.FromCustomer() {
		return nil
	}
	text, _ := m.Text()
	if text == "fail" {
		return kfpipe.Permanent(io.ErrUnexpectedEOF)
	}
	return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
})

// TestSimulatorAPI chats through the JSON API the page uses: a customer's
// message gets the bot's reply, a servicer's gets none (it is handled,
// and nothing more reaches WeChat), a message the handler rejects shows as
// a dead letter of the user.
func TestSimulatorAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := start(ctx, echo, options{addr: "127.0.0.1:0", out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()

	page := get[string](t, s.url)
	if !strings.Contains(page, "as the customer") {
		t.Fatalf("the page: %.200s", page)
	}
	post(t, s.url+"api/send", sendRequest{User: "u1", As: "customer", Text: "hello"})
	// The reply reaches the conversation while the handler runs; the
	// message shows handled once the handler has returned and its done mark
	// is written, a moment later.
	st := waitState(t, s.url, "u1", "the bot's reply and the message handled", func(st state) bool {
		return len(st.Messages) >= 2 && st.Messages[0].Status == "handled"
	})
	if m := st.Messages[1]; len(st.Messages) != 2 || !m.Reply || m.Text != "You said: hello" {
		t.Fatalf("conversation %+v, want the customer's message then the reply", st.Messages)
	}

	id := post(t, s.url+"api/send", sendRequest{User: "u1", As: "servicer", Text: "Hi, I am Alice from support"})
	st = waitState(t, s.url, "u1", "the servicer's message handled", func(st state) bool {
		return len(st.Messages) >= 3 && st.Messages[2].MsgID == id && st.Messages[2].Status == "handled"
	})
	// The handler has run for it: had it replied, the reply would be in.
	if len(st.Messages) != 3 || st.Messages[2].From != "servicer" {
		t.Fatalf("conversation %+v, want no reply to the servicer", st.Messages)
	}

	post(t, s.url+"api/send", sendRequest{User: "u2", As: "customer", Text: "fail"})
	st = waitState(t, s.url, "u2", "the dead letter", func(st state) bool { return len(st.DeadLetters) == 1 })
	if d := st.DeadLetters[0]; d.MsgID != st.Messages[0].MsgID || d.Reason == "" {
		t.Fatalf("dead letter %+v of message %+v", d, st.Messages[0])
	}

	// Bad input is refused with the field named.
	resp, err := http.Post(s.url+"api/send", "application/json", strings.NewReader(`{"user":"u1","as":"robot","text":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "as:") {
		t.Fatalf("as robot: %s %s", resp.Status, body)
	}
}

// TestSimulatorOnServices runs the simulator on the real test services
// (WithServices) instead of embedded ones: a message gets its reply.
func TestSimulatorOnServices(t *testing.T) {
	brokers, redisAddr := testenv.KafkaBrokers(t), testenv.RedisAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := start(ctx, echo, options{addr: "127.0.0.1:0", out: io.Discard, kafka: brokers, redis: redisAddr})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if st := get[state](t, s.url+"api/state?user=u1"); st.Kafka != brokers || st.Redis != redisAddr {
		t.Fatalf("backends %q %q, want %q %q", st.Kafka, st.Redis, brokers, redisAddr)
	}
	post(t, s.url+"api/send", sendRequest{User: "u1", As: "customer", Text: "hello"})
	st := waitState(t, s.url, "u1", "the bot's reply", func(st state) bool { return len(st.Messages) == 2 })
	if m := st.Messages[1]; !m.Reply || m.Text != "You said: hello" {
		t.Fatalf("conversation %+v", st.Messages)
	}
}

func TestParseArgs(t *testing.T) {
	for _, c := range []struct {
		args      []string
		sim       bool
		addr, cfg string
		err       string
	}{
		{args: []string{"--config", "c.yaml"}},
		{args: []string{"--simulate"}, sim: true, addr: DefaultAddr},
		{args: []string{"-simulate=:9000", "--config=c.yaml"}, sim: true, addr: ":9000", cfg: "c.yaml"},
		{args: []string{"--simulate", "--config", "c.yaml"}, sim: true, addr: DefaultAddr, cfg: "c.yaml"},
		{args: []string{"--simulate", "--verbose"}, err: `unknown argument "--verbose"`},
		{args: []string{"--simulate="}, err: "address is empty"},
		{args: []string{"--simulate", "--config"}, err: "--config needs a file"},
	} {
		sim, opts, err := parseArgs(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.args, err, c.err)
			}
			continue
		}
		o := options{addr: DefaultAddr}
		for _, f := range opts {
			f(&o)
		}
		if err != nil || sim != c.sim || (sim && (o.addr != c.addr || o.config != c.cfg)) {
			t.Errorf("%q: sim %v addr %q config %q err %v, want %v %q %q", c.args, sim, o.addr, o.config, err, c.sim, c.addr, c.cfg)
		}
	}
}

func waitState(t *testing.T, url, user, what string, ok func(state) bool) state {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := get[state](t, url+"api/state?user="+user)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: state %+v", what, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get[T any](t *testing.T, url string) T {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", url, resp.Status, body)
	}
	var v T
	if s, ok := any(&v).(*string); ok {
		*s = string(body)
		return v
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
	return v
}

func post(t *testing.T, url string, r sendRequest) string {
	t.Helper()
	b, _ := json.Marshal(r)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusOK || out["msgid"] == "" || out["warning"] != "" {
		t.Fatalf("send %+v: %s %v", r, resp.Status, out)
	}
	return out["msgid"]
}
