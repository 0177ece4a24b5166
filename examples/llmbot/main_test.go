package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// fakeModel is an OpenAI-compatible chat-completions endpoint on
// httptest: it records every request's messages and answers "answer N"
// (N counts the calls), after delay, or with status when it is set.
type fakeModel struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests [][]ChatMessage
	auth     []string
	delay    time.Duration
	slow     int // when > 0, only the first slow calls take delay
	status   int
}

func newFakeModel(t *testing.T) *fakeModel {
	f := &fakeModel{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "no such endpoint", http.StatusNotFound)
			return
		}
		var req chatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "test-model" {
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.requests = append(f.requests, req.Messages)
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		n, delay, status := len(f.requests), f.delay, f.status
		if f.slow > 0 && n > f.slow {
			delay = 0
		}
		f.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		if status != 0 {
			w.WriteHeader(status)
			fmt.Fprint(w, `{"error":{"message":"the model is overloaded"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"answer %d"}}]}`, n)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeModel) client() *Client {
	return &Client{BaseURL: f.srv.URL + "/v1", APIKey: "test-key", Model: "test-model", HTTP: &http.Client{Timeout: 5 * time.Second}}
}

func (f *fakeModel) calls() [][]ChatMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]ChatMessage(nil), f.requests...)
}

func (f *fakeModel) set(delay time.Duration, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay, f.status = delay, status
}

// TestHistoryReachesThePrompt: the second question's request carries the
// customer's first message and the human servicer's answer in between (as
// the assistant, named), in order, then the question; the bot replies with
// the model's answer.
func TestHistoryReachesThePrompt(t *testing.T) {
	model := newFakeModel(t)
	h := kfpipetest.New(t, Bot(model.client(), 20))
	h.Run(kfpipetest.Text("u1", "My parcel 123 has not arrived")).ExpectDone().ExpectTexts("answer 1")
	h.Run(kfpipetest.Text("u2", "another customer's question")).ExpectDone()
	h.Remember(kfpipetest.ServicerText("u1", "alice", "It left our warehouse today."))
	h.Run(kfpipetest.Text("u1", "When will it arrive?")).ExpectDone().ExpectTexts("answer 3")

	calls := model.calls()
	if len(calls) != 3 {
		t.Fatalf("%d model calls, want 3", len(calls))
	}
	got := calls[2]
	want := []ChatMessage{
		{Role: "system", Content: systemPrompt},
		{Role: "user", Content: "My parcel 123 has not arrived"},
		{Role: "assistant", Content: "answer 1"},
		{Role: "assistant", Content: "[servicer alice] It left our warehouse today."},
		{Role: "user", Content: "When will it arrive?"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the third request's messages:\n%v\nwant:\n%v", got, want)
	}
	if model.auth[0] != "Bearer test-key" {
		t.Errorf("Authorization %q, want the key as a bearer token", model.auth[0])
	}
}

// TestTurnsBound: only the last turns go to the model.
func TestTurnsBound(t *testing.T) {
	model := newFakeModel(t)
	h := kfpipetest.New(t, Bot(model.client(), 2))
	for i := range 4 {
		h.Remember(kfpipetest.Text("u1", fmt.Sprintf("earlier %d", i)))
	}
	h.Run(kfpipetest.Text("u1", "now")).ExpectDone()
	got := model.calls()[0]
	if len(got) != 4 || got[1].Content != "earlier 2" || got[2].Content != "earlier 3" || got[3].Content != "now" {
		t.Fatalf("messages %v, want the system prompt, the last 2 turns and the question", got)
	}
}

// TestRunAgainAsksTheModelOnce: a message handled twice (after a crash)
// is answered with the same words, and the model is asked once; so is one
// whose reply WeChat failed the first time (retried in place).
func TestRunAgainAsksTheModelOnce(t *testing.T) {
	model := newFakeModel(t)
	h := kfpipetest.New(t, Bot(model.client(), 20))
	first, second := h.RunTwice(kfpipetest.Text("u1", "Do you ship abroad?"))
	first.ExpectDone().ExpectTexts("answer 1")
	second.ExpectDone()
	if n := len(model.calls()); n != 1 {
		t.Fatalf("the model was asked %d times for one message, want once", n)
	}
	if d := h.Delivered("u1"); len(d) != 1 || d[0] != "answer 1" {
		t.Fatalf("delivered %q, want the answer once", d)
	}

	// WeChat throttles the reply past the client's own retries: the
	// attempt fails and the consumer runs the handler again.
	h.FailNext(kfpipetest.APISendMsg, 4, kfpipetest.ErrcodeFrequencyLimit)
	r := h.Run(kfpipetest.Text("u1", "And to Japan?")).ExpectDone().ExpectRetried()
	if n := len(model.calls()); n != 2 {
		t.Fatalf("the model was asked %d times after a retried reply, want 2 in all (%d attempts)", n, r.Attempts)
	}
	if d := h.Delivered("u1"); len(d) != 2 || d[1] != "answer 2" {
		t.Fatalf("delivered %q, want the second answer once", d)
	}
}

// TestSlowModel: an LLM takes seconds; within the attempt timeout the
// answer goes out, past it the attempt is cancelled and retried, and the
// model (now quick) answers the retry. Nothing is sent twice.
func TestSlowModel(t *testing.T) {
	model := newFakeModel(t)
	model.set(300*time.Millisecond, 0)
	h := kfpipetest.New(t, Bot(model.client(), 20), kfpipetest.AttemptTimeout(2*time.Second))
	if r := h.Run(kfpipetest.Text("u1", "slow question")).ExpectDone().ExpectTexts("answer 1"); r.Retried() {
		t.Fatalf("a 300 ms answer within a 2 s attempt was retried (%d attempts)", r.Attempts)
	}

	model.set(3*time.Second, 0)
	model.mu.Lock()
	model.slow = len(model.requests) + 1 // the next call is slow, the retry's is not
	model.mu.Unlock()
	h2 := kfpipetest.New(t, Bot(model.client(), 20), kfpipetest.AttemptTimeout(500*time.Millisecond), kfpipetest.Attempts(2))
	r := h2.Run(kfpipetest.Text("u2", "too slow")).ExpectDone().ExpectRetried()
	if d := h2.Delivered("u2"); len(d) != 1 || !strings.HasPrefix(d[0], "answer ") {
		t.Fatalf("delivered %q after %d attempts, want one answer", d, r.Attempts)
	}
}

// TestModelDown: an overloaded model (503) fails the message as a
// recoverable downstream error (the DLQ retries it later); a request the
// endpoint calls malformed (400) is permanent.
func TestModelDown(t *testing.T) {
	model := newFakeModel(t)
	model.set(0, http.StatusServiceUnavailable)
	h := kfpipetest.New(t, Bot(model.client(), 20), kfpipetest.Attempts(2))
	h.Run(kfpipetest.Text("u1", "hello?")).ExpectDeadLettered("downstream_error")
	if d := h.Delivered("u1"); len(d) != 0 {
		t.Fatalf("delivered %q with the model down", d)
	}
	bad := &Client{BaseURL: model.srv.URL + "/v1", Model: "unknown-model", HTTP: http.DefaultClient}
	kfpipetest.New(t, Bot(bad, 20)).Run(kfpipetest.Text("u1", "hello?")).ExpectPermanent()
}

// TestQuietWhileHumanServes: no model call and no reply while a servicer
// holds the session, nor for the servicer's own messages; a photo gets a
// fixed answer without the model.
func TestQuietWhileHumanServes(t *testing.T) {
	model := newFakeModel(t)
	h := kfpipetest.New(t, Bot(model.client(), 20))
	h.SetSessionState("u1", kf.StateServicer, "alice")
	h.Run(kfpipetest.Text("u1", "are you there?")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.ServicerText("u1", "alice", "yes")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.Image("u2", "media-1")).ExpectDone().ExpectTexts(notText)
	if n := len(model.calls()); n != 0 {
		t.Fatalf("%d model calls, want none", n)
	}
}

// TestConfigFromEnv: the defaults, OPENAI_API_KEY as the fallback key,
// and a bad value named.
func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{"OPENAI_API_KEY": "k1"}
	c, err := configFromEnv(func(k string) string { return env[k] })
	if err != nil || c.baseURL != "https://api.openai.com/v1" || c.apiKey != "k1" || c.model != "gpt-4o-mini" || c.turns != 20 || c.timeout != 45*time.Second {
		t.Fatalf("defaults %+v (%v)", c, err)
	}
	env = map[string]string{"LLMBOT_TURNS": "many"}
	if _, err := configFromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "LLMBOT_TURNS") {
		t.Fatalf("LLMBOT_TURNS=many: %v, want an error naming it", err)
	}
}

var _ = kfpipe.ErrNoHistory
