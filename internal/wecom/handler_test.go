package wecom_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// The official vectors; see crypto_test.go.
const (
	vecToken     = "QDG6eK"
	vecAESKey    = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
	vecReceiveID = "wx5823bf96d3bd56c7"
	// The echostr as it arrives in the query: '/', '+' and '=' escaped.
	vecVerifyQuery = "msg_signature=5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3&timestamp=1409659589&nonce=263014780" +
		"&echostr=P9nAzCzyDtyTWESHep1vC5X9xho%2FqYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp%2B4RPcs8TgAE7OaBO%2BFZXvnaqQ%3D%3D"
	vecPostQuery = "msg_signature=477715d11cdb4164915debcba66cb864d751f3e6&timestamp=1409659813&nonce=1372623149"
	vecPostBody  = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>"
)

type triggerCall struct{ openKfID, token string }

type recorder struct {
	mu    sync.Mutex
	calls []triggerCall
}

func (r *recorder) trigger(_ context.Context, openKfID, token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, triggerCall{openKfID, token})
}

func (r *recorder) get() []triggerCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]triggerCall(nil), r.calls...)
}

// counterValue reads kfpipe_callback_requests_total{result} from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	v, _ := testenv.Gathered(t, reg, "kfpipe_callback_requests_total", "result", result)
	return v
}

type fixture struct {
	srv    *httptest.Server
	reg    *prometheus.Registry
	rec    *recorder
	crypto *wecom.Crypto
	sender *wecomtest.CallbackSender
	now    time.Time
}

func newFixture(t *testing.T, cfg wecom.CallbackConfig, replay wecom.ReplayCache) *fixture {
	t.Helper()
	c, err := wecom.NewCrypto(vecToken, vecAESKey, vecReceiveID)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{reg: prometheus.NewRegistry(), rec: &recorder{}, crypto: c, now: time.Now()}
	if cfg.Clock == nil {
		cfg.Clock = func() time.Time { return f.now }
	}
	h := wecom.NewCallbackHandler(cfg, c, replay, f.rec.trigger, wecom.WithHandlerRegisterer(f.reg))
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	f.sender = &wecomtest.CallbackSender{URL: f.srv.URL, Token: vecToken, AESKey: vecAESKey, CorpID: vecReceiveID,
		Clock: func() time.Time { return f.now }}
	return f
}

// signed builds a POST whose query signs enc at time ts.
func (f *fixture) signed(t *testing.T, ts time.Time, enc string, body []byte) *http.Request {
	t.Helper()
	tss := strconv.FormatInt(ts.Unix(), 10)
	q := url.Values{"msg_signature": {f.crypto.Signature(tss, "42", enc)}, "timestamp": {tss}, "nonce": {"42"}}
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// encrypted builds a signed POST carrying plain encrypted by c.
func (f *fixture) encrypted(t *testing.T, c *wecom.Crypto, plain []byte) *http.Request {
	t.Helper()
	enc, err := c.Encrypt(plain)
	if err != nil {
		t.Fatal(err)
	}
	return f.signed(t, f.now, enc, wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc}))
}

func kfEvent(openKfID, token string) []byte {
	return wecom.MarshalEventXML(&wecom.Event{ToUserName: vecReceiveID, CreateTime: 1, MsgType: "event",
		Event: wecom.EventKFMsgOrEvent, Token: token, OpenKfID: openKfID})
}

// TestCallbackHandler covers every answer over real HTTP. Replay detection
// is off here (TestCallbackReplay covers it with Redis) so that these cases
// run without services.
func TestCallbackHandler(t *testing.T) {
	cfg := wecom.CallbackConfig{MaxBodyBytes: 4096, TimestampWindow: 5 * time.Minute, ReplayWindow: time.Minute}

	type want struct {
		code     int
		body     string // exact body when set
		contains string // otherwise a substring of it
		result   string
		triggers []triggerCall
	}
	tests := []struct {
		name string
		req  func(t *testing.T, f *fixture) *http.Request
		want want
	}{
		{"kf event", func(t *testing.T, f *fixture) *http.Request {
			r, err := f.sender.EventRequest(context.Background(), "wk-1", "tok-1")
			if err != nil {
				t.Fatal(err)
			}
			return r
		}, want{200, "success", "", wecom.ResultOK, []triggerCall{{"wk-1", "tok-1"}}}},
		{"verify url", func(t *testing.T, f *fixture) *http.Request {
			q, _ := f.sender.SignedQuery("")
			enc, _ := f.crypto.Encrypt([]byte("echo-123"))
			q.Set("msg_signature", f.crypto.Signature(q.Get("timestamp"), q.Get("nonce"), enc))
			q.Set("echostr", enc)
			r, _ := http.NewRequest(http.MethodGet, f.srv.URL+"?"+q.Encode(), nil)
			return r
		}, want{200, "echo-123", "", wecom.ResultOK, nil}},
		{"verify url, '+' left unescaped", func(t *testing.T, f *fixture) *http.Request {
			var enc string
			for !strings.Contains(enc, "+") { // retry until the random prefix yields a '+'
				enc, _ = f.crypto.Encrypt([]byte("plus"))
			}
			ts := strconv.FormatInt(f.now.Unix(), 10)
			raw := "msg_signature=" + f.crypto.Signature(ts, "7", enc) + "&timestamp=" + ts + "&nonce=7&echostr=" +
				strings.NewReplacer("/", "%2F", "=", "%3D").Replace(enc)
			r, _ := http.NewRequest(http.MethodGet, f.srv.URL+"?"+raw, nil)
			return r
		}, want{200, "plus", "", wecom.ResultOK, nil}},
		{"verify url, bad signature", func(t *testing.T, f *fixture) *http.Request {
			enc, _ := f.crypto.Encrypt([]byte("x"))
			ts := strconv.FormatInt(f.now.Unix(), 10)
			q := url.Values{"msg_signature": {strings.Repeat("0", 40)}, "timestamp": {ts}, "nonce": {"1"}, "echostr": {enc}}
			r, _ := http.NewRequest(http.MethodGet, f.srv.URL+"?"+q.Encode(), nil)
			return r
		}, want{401, "", "bad msg_signature", wecom.ResultBadSignature, nil}},
		{"verify url, no echostr", func(t *testing.T, f *fixture) *http.Request {
			r, _ := http.NewRequest(http.MethodGet, f.srv.URL+"?msg_signature=a&timestamp=1&nonce=1", nil)
			return r
		}, want{400, "", "missing echostr", wecom.ResultBadRequest, nil}},
		{"missing signature", func(t *testing.T, f *fixture) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, f.srv.URL+"?timestamp=1&nonce=2", strings.NewReader(vecPostBody))
			return r
		}, want{401, "", "missing msg_signature", wecom.ResultBadSignature, nil}},
		{"missing nonce", func(t *testing.T, f *fixture) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, f.srv.URL+"?msg_signature=abc&timestamp=1", strings.NewReader(vecPostBody))
			return r
		}, want{401, "", "missing", wecom.ResultBadSignature, nil}},
		{"wrong signature", func(t *testing.T, f *fixture) *http.Request {
			r := f.encrypted(t, f.crypto, kfEvent("wk-1", "t"))
			q := r.URL.Query()
			q.Set("nonce", "43") // signed with 42
			r.URL.RawQuery = q.Encode()
			return r
		}, want{401, "", "bad msg_signature", wecom.ResultBadSignature, nil}},
		{"stale timestamp", func(t *testing.T, f *fixture) *http.Request {
			enc, _ := f.crypto.Encrypt(kfEvent("wk-1", "t"))
			return f.signed(t, f.now.Add(-6*time.Minute), enc, wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc}))
		}, want{401, "", "timestamp", wecom.ResultStaleTimestamp, nil}},
		{"future timestamp", func(t *testing.T, f *fixture) *http.Request {
			enc, _ := f.crypto.Encrypt(kfEvent("wk-1", "t"))
			return f.signed(t, f.now.Add(6*time.Minute), enc, wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc}))
		}, want{401, "", "timestamp", wecom.ResultStaleTimestamp, nil}},
		{"timestamp inside window", func(t *testing.T, f *fixture) *http.Request {
			enc, _ := f.crypto.Encrypt(kfEvent("wk-2", "t2"))
			return f.signed(t, f.now.Add(-4*time.Minute), enc, wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc}))
		}, want{200, "success", "", wecom.ResultOK, []triggerCall{{"wk-2", "t2"}}}},
		{"body not an envelope", func(t *testing.T, f *fixture) *http.Request {
			return f.signed(t, f.now, "", []byte("hello"))
		}, want{400, "", "envelope", wecom.ResultBadRequest, nil}},
		{"undecryptable, validly signed", func(t *testing.T, f *fixture) *http.Request {
			enc := strings.Repeat("A", 44)
			return f.signed(t, f.now, enc, wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc}))
		}, want{400, "", "cannot decrypt", wecom.ResultBadRequest, nil}},
		{"wrong receive id", func(t *testing.T, f *fixture) *http.Request {
			other, err := wecom.NewCrypto(vecToken, vecAESKey, "ww-other-corp")
			if err != nil {
				t.Fatal(err)
			}
			return f.encrypted(t, other, kfEvent("wk-1", "t"))
		}, want{400, "", "wrong receive id", wecom.ResultBadRequest, nil}},
		{"decrypts to non-xml", func(t *testing.T, f *fixture) *http.Request {
			return f.encrypted(t, f.crypto, []byte("not xml"))
		}, want{400, "", "not a callback event", wecom.ResultBadRequest, nil}},
		{"kf event without open_kfid", func(t *testing.T, f *fixture) *http.Request {
			return f.encrypted(t, f.crypto, kfEvent("", "t"))
		}, want{400, "", "not a callback event", wecom.ResultBadRequest, nil}},
		{"other event acknowledged, no trigger", func(t *testing.T, f *fixture) *http.Request {
			return f.encrypted(t, f.crypto, []byte("<xml><MsgType>event</MsgType><Event>change_contact</Event></xml>"))
		}, want{200, "success", "", wecom.ResultIgnored, nil}},
		{"PUT", func(t *testing.T, f *fixture) *http.Request {
			r, _ := http.NewRequest(http.MethodPut, f.srv.URL, strings.NewReader("x"))
			return r
		}, want{405, "", "method not allowed", wecom.ResultMethod, nil}},
		{"body too large, with length", func(t *testing.T, f *fixture) *http.Request {
			return f.signed(t, f.now, "", bytes.Repeat([]byte("a"), 4097))
		}, want{413, "", "too large", wecom.ResultTooLarge, nil}},
		{"body too large, chunked", func(t *testing.T, f *fixture) *http.Request {
			r := f.signed(t, f.now, "", nil)
			r.Body = io.NopCloser(io.MultiReader(strings.NewReader("<xml><Encrypt>"), bytes.NewReader(bytes.Repeat([]byte("A"), 8192))))
			r.ContentLength = -1
			return r
		}, want{413, "", "too large", wecom.ResultTooLarge, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, cfg, nil)
			resp, err := http.DefaultClient.Do(tt.req(t, f))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want.code {
				t.Fatalf("status = %d (%q), want %d", resp.StatusCode, body, tt.want.code)
			}
			if tt.want.body != "" && string(body) != tt.want.body {
				t.Fatalf("body = %q, want %q", body, tt.want.body)
			}
			if !strings.Contains(string(body), tt.want.contains) {
				t.Fatalf("body = %q, want it to contain %q", body, tt.want.contains)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Fatalf("Content-Type = %q", ct)
			}
			if tt.want.code == 405 && resp.Header.Get("Allow") != "GET, POST" {
				t.Fatalf("Allow = %q", resp.Header.Get("Allow"))
			}
			if got := counterValue(t, f.reg, tt.want.result); got != 1 {
				t.Fatalf("kfpipe_callback_requests_total{result=%q} = %v, want 1", tt.want.result, got)
			}
			if got := f.rec.get(); len(got) != len(tt.want.triggers) || (len(got) > 0 && got[0] != tt.want.triggers[0]) {
				t.Fatalf("triggers = %v, want %v", got, tt.want.triggers)
			}
		})
	}
}

// TestCallbackOfficialVectors drives WeChat's documented requests through the
// handler, with the clock set to when they were made (2014).
func TestCallbackOfficialVectors(t *testing.T) {
	cfg := wecom.CallbackConfig{TimestampWindow: 5 * time.Minute}
	t.Run("url verification", func(t *testing.T) {
		f := newFixture(t, cfg, nil)
		f.now = time.Unix(1409659589, 0).Add(30 * time.Second)
		resp, err := http.Get(f.srv.URL + "?" + vecVerifyQuery)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "1616140317555161061" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
	})
	t.Run("post", func(t *testing.T) {
		f := newFixture(t, cfg, nil)
		f.now = time.Unix(1409659813, 0)
		resp, err := http.Post(f.srv.URL+"?"+vecPostQuery, "text/xml", strings.NewReader(vecPostBody))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		// The documented POST is a plain text message, not a KF event:
		// acknowledged, nothing to sync.
		if resp.StatusCode != 200 || string(body) != "success" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		if got := counterValue(t, f.reg, wecom.ResultIgnored); got != 1 {
			t.Fatalf("ignored = %v", got)
		}
	})
	t.Run("post with today's clock is stale", func(t *testing.T) {
		f := newFixture(t, cfg, nil)
		resp, err := http.Post(f.srv.URL+"?"+vecPostQuery, "text/xml", strings.NewReader(vecPostBody))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	})
}

func TestCallbackReplay(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	f := newFixture(t, wecom.CallbackConfig{TimestampWindow: time.Minute, ReplayWindow: time.Minute},
		wecom.NewRedisReplayCache(rdb, prefix))
	req, err := f.sender.EventRequest(context.Background(), "wk-r", "tok-r")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(req.Body)
	send := func() (int, string) {
		r, _ := http.NewRequest(http.MethodPost, req.URL.String(), bytes.NewReader(body))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i := 0; i < 3; i++ {
		if code, b := send(); code != 200 || b != "success" {
			t.Fatalf("send %d: %d %q", i, code, b)
		}
	}
	if got := f.rec.get(); len(got) != 1 {
		t.Fatalf("triggers = %v, want exactly one", got)
	}
	if ok, replay := counterValue(t, f.reg, wecom.ResultOK), counterValue(t, f.reg, wecom.ResultReplay); ok != 1 || replay != 2 {
		t.Fatalf("ok = %v, replay = %v", ok, replay)
	}
	// The key is where the docs say, with the replay window as TTL.
	keys, err := rdb.Keys(context.Background(), prefix+"wecom:nonce:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys = %v, %v", keys, err)
	}
	if ttl := rdb.PTTL(context.Background(), keys[0]).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("ttl = %v", ttl)
	}
	// A fresh delivery of the same event (new nonce) is not a replay.
	resp, err := f.sender.SendEvent(context.Background(), "wk-r", "tok-r")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := f.rec.get(); len(got) != 2 {
		t.Fatalf("triggers = %v, want two", got)
	}
}

// TestCallbackReplayCacheDown: when Redis cannot answer, the handler says 503
// (our fault, WeChat retries) and does not trigger without replay protection.
func TestCallbackReplayCacheDown(t *testing.T) {
	ln := httptest.NewServer(http.NotFoundHandler()) // a port that is closed once we stop it
	addr := ln.Listener.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	f := newFixture(t, wecom.CallbackConfig{ReplayWindow: time.Minute}, wecom.NewRedisReplayCache(rdb, "x:"))
	resp, err := f.sender.SendEvent(context.Background(), "wk-1", "t")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d, want 503", resp.StatusCode)
	}
	if len(f.rec.get()) != 0 || counterValue(t, f.reg, wecom.ResultUnavailable) != 1 {
		t.Fatalf("triggers %v, unavailable %v", f.rec.get(), counterValue(t, f.reg, wecom.ResultUnavailable))
	}
}

// TestCallbackSenderVerifyURL checks the fake WeChat's URL check against the
// handler, as the demo and other packages' tests use it.
func TestCallbackSenderVerifyURL(t *testing.T) {
	f := newFixture(t, wecom.CallbackConfig{TimestampWindow: time.Minute}, nil)
	for i := 0; i < 20; i++ { // random ciphertexts: some contain '+' and '/'
		echo := "echo-" + strconv.Itoa(i)
		resp, err := f.sender.VerifyURL(context.Background(), echo)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != echo {
			t.Fatalf("%d %q, want %q", resp.StatusCode, body, echo)
		}
	}
}

func BenchmarkCallbackHandler(b *testing.B) {
	c, _ := wecom.NewCrypto(vecToken, vecAESKey, vecReceiveID)
	h := wecom.NewCallbackHandler(wecom.CallbackConfig{TimestampWindow: time.Minute}, c, nil, func(context.Context, string, string) {})
	s := &wecomtest.CallbackSender{URL: "http://kf.test/cb", Token: vecToken, AESKey: vecAESKey, CorpID: vecReceiveID}
	req, err := s.EventRequest(context.Background(), "wk-1", "tok")
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(req.Body)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, req.URL.String(), bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatal(w.Code, w.Body.String())
		}
	}
}
