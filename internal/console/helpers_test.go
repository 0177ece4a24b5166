package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

const (
	operatorToken = "op-token-0123456789abcdef"
	viewerToken   = "view-token-0123456789abcdef"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testTokens() []config.AdminToken {
	return []config.AdminToken{
		{Name: "alice", Token: operatorToken, Role: RoleOperator},
		{Name: "bob", Token: viewerToken, Role: RoleViewer},
	}
}

func sampleMessages() []DLQMessage {
	next := t0.Add(time.Hour)
	return []DLQMessage{
		{ID: "m1", User: "u1", Reason: "rate_limited", State: "due", FailureTime: t0, NextRetryTime: &next,
			SourceTopic: "qywx-chat-messages", SourceOffset: 10, Message: json.RawMessage(`{"text":"hi"}`)},
		{ID: "m2", User: "u2", Reason: "downstream_error", State: "review", FailureTime: t0.Add(-time.Minute), RetryCount: 5,
			Details: "=HYPERLINK(\"x\")"},
		{ID: "m3", User: "u1", Reason: "invalid_message", State: "review", FailureTime: t0.Add(-2 * time.Minute)},
		{ID: "m4", User: "u3", Reason: "rate_limited", State: "retried", FailureTime: t0.Add(-3 * time.Minute)},
	}
}

type fixture struct {
	srv    *Server
	http   *httptest.Server
	dlq    *memDLQ
	rl     *memRL
	rdb    *redis.Client
	prefix string
}

// newFixture serves the admin API on a real HTTP server, with in-memory
// stores and the audit stream on the real Redis.
func newFixture(t *testing.T) *fixture { return newFixtureWith(t, nil) }

// newFixtureWith is newFixture with the pipeline's view p (nil: none).
func newFixtureWith(t *testing.T, p Pipeline) *fixture {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	f := &fixture{dlq: newMemDLQ(t0, sampleMessages()...), rl: newMemRL(t0), rdb: rdb, prefix: prefix}
	f.rl.block["bad1"] = 0
	f.rl.block["bad2"] = time.Hour
	return f.start(t, Config{Pipeline: p})
}

// start serves f's stores on a real HTTP server with cfg, its tokens,
// body limit, key prefix and clock filled in.
func (f *fixture) start(t *testing.T, cfg Config) *fixture {
	t.Helper()
	cfg.Tokens, cfg.MaxBodyBytes, cfg.Prefix, cfg.Clock = testTokens(), 2048, f.prefix, testenv.NewClock(t0)
	srv, err := New(cfg, f.dlq, f.rl, f.rdb, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	t.Cleanup(func() { _ = srv.Close() })
	f.http = httptest.NewServer(srv)
	t.Cleanup(f.http.Close)
	return f
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// do sends a request with the given Authorization value ("" for none).
func (f *fixture) do(t *testing.T, auth, method, path, body string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, f.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// auditEntries reads the whole audit stream.
func (f *fixture) auditEntries(t *testing.T) []map[string]any {
	t.Helper()
	msgs, err := f.rdb.XRange(context.Background(), f.prefix+"audit", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		out[i] = m.Values
	}
	return out
}

// nopRedis is a client for a port nobody listens on: for tests that never
// write (or ignore) the audit stream.
func nopRedis() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
}

func newHTTPServer(t *testing.T, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// waitBatch waits for the batch a batch write answered r with to end, and
// returns it as GET /admin/dlq/batches/{id} shows it.
func (f *fixture) waitBatch(t *testing.T, r response) Batch {
	t.Helper()
	var plan BatchPlan
	if err := json.Unmarshal(r.body, &plan); err != nil || plan.Batch == nil {
		t.Fatalf("answer %s has no batch (%v)", r.body, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := f.do(t, "Bearer "+viewerToken, "GET", "/admin/dlq/batches/"+plan.Batch.ID, "")
		var b Batch
		if err := json.Unmarshal(got.body, &b); err != nil || got.status != 200 {
			t.Fatalf("GET batch: %d %s", got.status, got.body)
		}
		if b.State != BatchRunning {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch still running after 15s: %+v", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
