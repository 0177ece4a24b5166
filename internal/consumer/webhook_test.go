package consumer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestWebhookReferenceReceiver runs the Python reference receiver
// (examples/webhook/receiver.py, standard library only) and sends it
// messages through the http handler: a request signed with either secret
// of a rotation is accepted, a forged or stale signature is refused (401,
// so the handler reports a permanent failure), and a retry with the same
// Idempotency-Key is answered without a second effect and with the same
// replies.
func TestWebhookReferenceReceiver(t *testing.T) {
	python := testenv.Tool(t, "python3")
	port := testenv.FreePort(t)
	cmd := exec.Command(python, filepath.Join(testenv.RepoRoot(t), "examples", "webhook", "receiver.py"), strconv.Itoa(port))
	cmd.Env = append(cmd.Environ(), "KFPIPE_WEBHOOK_SECRETS=old-secret,new-secret")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "listening" {
		t.Fatalf("receiver did not start: %q", lines.Text())
	}
	var mu sync.Mutex
	var applied []string
	go func() {
		for lines.Scan() {
			mu.Lock()
			applied = append(applied, lines.Text())
			mu.Unlock()
		}
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d/kf", port)
	ctx := context.Background()
	for _, secret := range []string{"new-secret", "old-secret"} {
		if err := SignedHTTPHandler(url, 5*time.Second, nil, secret).Handle(ctx, chat("u-"+secret, 1)); err != nil {
			t.Fatalf("signed with %s: %v", secret, err)
		}
	}
	err = SignedHTTPHandler(url, 5*time.Second, nil, "forged").Handle(ctx, chat("u-forged", 1))
	if err == nil || !handler.IsPermanent(err) {
		t.Fatalf("forged signature: %v, want a permanent failure (401)", err)
	}
	// A captured request replayed an hour later.
	body := []byte(`{"upstream_msgid":"x"}`)
	stale := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Kfpipe-Timestamp", stale)
	req.Header.Set("Kfpipe-Signature", Signature("new-secret", stale, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("stale signature answered %d, want 401", resp.StatusCode)
	}
	// A retry of an applied message (same Idempotency-Key) has no second
	// effect, and its answer carries the same replies for kfpipe to send.
	var answers []string
	keep := func(_ context.Context, body []byte) error { answers = append(answers, string(body)); return nil }
	text := chat("u-new-secret", 1)
	text.Content = []byte(`{"msgtype":"text","text":{"content":"hi there"}}`)
	for range 2 {
		if err := WebhookHandler(url, 5*time.Second, nil, "new-secret", keep).Handle(ctx, text); err != nil {
			t.Fatal(err)
		}
	}
	if len(answers) != 2 || answers[0] != answers[1] || !strings.Contains(answers[0], `"You said: hi there"`) {
		t.Fatalf("answers %q, want the same echo reply twice", answers)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 2 {
		t.Fatalf("receiver applied %v, want the two signed messages once each", applied)
	}
}

// TestRetryAfterHonoured: a receiver answering 429 with Retry-After: 2 is
// retried about 2 s later (not after the 1 ms backoff) and the message is
// not dead-lettered. Before, every 4xx was permanent: a rate-limited
// receiver's messages went to the DLQ.
func TestRetryAfterHonoured(t *testing.T) {
	var calls atomic.Int32
	var first, second atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			first.Store(time.Now().UnixNano())
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		second.Store(time.Now().UnixNano())
	}))
	defer srv.Close()
	dlq := &memDLQ{}
	c, p := unitConsumer(t, SignedHTTPHandler(srv.URL, 5*time.Second, nil, "s"), dlq, newMemState())
	p.tracker.Add(1)
	c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	dlq.wg.Wait()
	if letters := dlq.all(); len(letters) != 0 {
		t.Fatalf("dead-lettered %+v; a 429 is retryable", letters)
	}
	if gap := time.Duration(second.Load() - first.Load()); calls.Load() != 2 || gap < 1900*time.Millisecond {
		t.Fatalf("%d calls, retried after %v; want the second ~2 s after the first", calls.Load(), gap)
	}
}

// TestReceiverNotCalledAgainWhenItsRepliesFail: a receiver answered 2xx
// and the replies its answer carries could not be sent (the state store
// was unreachable for the reply's claim). The message's next attempt sends
// the kept answer's replies without calling the receiver again: it did its
// work once. A permanent failure of the replies keeps nothing. Without the
// kept answer, a Redis partition during a reply made two effects of one
// message (the nemesis, seed 48).
func TestReceiverNotCalledAgainWhenItsRepliesFail(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		fmt.Fprintf(w, `{"replies":[{"msgtype":"text","text":{"content":"answer %d"}}]}`, n)
	}))
	defer srv.Close()
	var got []string
	fail := 1
	respond := func(_ context.Context, body []byte) error {
		got = append(got, string(body))
		if fail > 0 {
			fail--
			return fmt.Errorf("reply claim: state store unreachable")
		}
		return nil
	}
	h := WebhookHandler(srv.URL, 5*time.Second, nil, "", respond)
	ctx := context.Background()
	m := chat("u-kept", 1)
	if err := h.Handle(ctx, m); err == nil {
		t.Fatal("first attempt: the replies failed, want an error")
	}
	if err := h.Handle(ctx, m); err != nil {
		t.Fatalf("second attempt: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("receiver called %d times, want once", n)
	}
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("replies sent from %q, want the first answer twice", got)
	}
	// A permanent failure is the message's end: nothing is kept.
	respond2 := func(context.Context, []byte) error { return handler.Permanent(fmt.Errorf("bad reply")) }
	h2 := WebhookHandler(srv.URL, 5*time.Second, nil, "", respond2)
	p := chat("u-permanent", 1)
	for range 2 {
		if err := h2.Handle(ctx, p); !handler.IsPermanent(err) {
			t.Fatalf("permanent reply failure: %v", err)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("receiver called %d times in all, want 3 (a permanent failure keeps no answer)", n)
	}
}

// TestKeptAnswersBounded: the kept answers stay within their count and
// bytes, an expired one is not handed out, and one taken is gone.
func TestKeptAnswersBounded(t *testing.T) {
	now := time.Unix(0, 0)
	a := newAnswers(func() time.Time { return now })
	big := make([]byte, maxAnswerBytes/2+1)
	if !a.keep("a", big) {
		t.Fatal("the first large answer was not kept")
	}
	if a.keep("b", big) {
		t.Fatal("a second large answer past maxAnswerBytes was kept")
	}
	if !a.keep("a", []byte("small")) || a.bytes != len("small") {
		t.Fatalf("keeping a key again: bytes %d, want %d", a.bytes, len("small"))
	}
	if b, ok := a.take("a"); !ok || string(b) != "small" {
		t.Fatalf("take: %q %v", b, ok)
	}
	if _, ok := a.take("a"); ok {
		t.Fatal("an answer taken twice")
	}
	a.keep("c", []byte("x"))
	now = now.Add(answerKeep + time.Second)
	if _, ok := a.take("c"); ok {
		t.Fatal("an expired answer was handed out")
	}
	if a.bytes != 0 {
		t.Fatalf("bytes %d after all were taken, want 0", a.bytes)
	}
}
