package console

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// FuzzAdminDecode feeds arbitrary bodies to every write endpoint (the body
// decoders and the validation after them): no panic, no 5xx, and every
// answer is a JSON object.
func FuzzAdminDecode(f *testing.F) {
	seeds := []struct {
		route uint8
		body  string
	}{
		{0, `{"reason":"fixed"}`},
		{0, `{"reason":5}`},
		{0, `{"reasn":"x"}`},
		{0, ``},
		{1, `{"filter":{"user":"u1"},"reason":"x"}`},
		{1, `{"filter":{"all":true},"reason":"x"}`},
		{1, `{"filter":{"limit":-1,"user":"u1"},"reason":"x"}`},
		{2, `{"filter":{"reason":"rate_limited","review":true},"reason":"x"}`},
		{2, `{"filter":null,"reason":"x"}`},
		{3, `{"reason":"x"}{"reason":"y"}`},
		{4, `{"reason":"x","duration":"2h"}`},
		{4, `{"reason":"x","duration":"9999999999h"}`},
		{5, `["reason"]`},
		{6, `{"reason":"\u0000"}`},
		{7, `{"group":"vip","reason":"x"}`},
		{7, `{"group":"` + string(make([]byte, 100)) + `","reason":"x"}`},
		{1, `{"filter":{"user":"\ud800"},"reason":"x"}`},
	}
	for _, s := range seeds {
		f.Add(s.route, []byte(s.body))
	}
	// Real Redis for the audit of the writes that pass validation; the
	// stream is trimmed so a long fuzzing run stays small.
	rdb, prefix := testenv.Redis(f)
	dlqStore, rl := newMemDLQ(t0, sampleMessages()...), newMemRL(t0)
	srv, err := New(Config{Tokens: testTokens(), MaxBodyBytes: 4096, Prefix: prefix, AuditMaxLen: 1000, Clock: testenv.NewClock(t0)},
		dlqStore, rl, rdb, zap.NewNop(), nil)
	if err != nil {
		f.Fatal(err)
	}
	var writes []string
	for _, r := range srv.Routes() {
		if m, _ := routePath(r); m != http.MethodGet {
			writes = append(writes, r)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		method, path := routePath(writes[int(route)%len(writes)])
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+operatorToken)
		rec := httptest.NewRecorder()
		start := time.Now()
		srv.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: status %d %s", method, path, body, rec.Code, rec.Body)
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("%s %s %q: answer %q is not a JSON object", method, path, body, rec.Body)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("took %s", d)
		}
	})
}
