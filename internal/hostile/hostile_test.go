package hostile_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Bounds of the randomized part: at most this many requests, and no longer
// than this (whichever comes first), so the scenario stays inside make test.
const (
	randomRequests = 2000
	randomBudget   = 20 * time.Second
)

// callbacks builds callback requests for the producer under test.
type callbacks struct {
	url    string // the callback URL, no query
	corpID string
	good   *wecom.Crypto
}

func newCrypto(t *testing.T, token, aesKey, corpID string) *wecom.Crypto {
	t.Helper()
	c, err := wecom.NewCrypto(token, aesKey, corpID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func nonce() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatUint(uint64(b[0])<<24|uint64(b[1])<<16|uint64(b[2])<<8|uint64(b[3]), 10)
}

func kfEvent(corpID, openKfID, token string, at time.Time) []byte {
	return wecom.MarshalEventXML(&wecom.Event{ToUserName: corpID, CreateTime: at.Unix(), MsgType: "event",
		Event: wecom.EventKFMsgOrEvent, Token: token, OpenKfID: openKfID})
}

// signed encrypts plain with c and signs it with c at ts with nonce: c
// decides whether the token and receive ID are the right ones.
func (cb callbacks) signed(t *testing.T, c *wecom.Crypto, plain []byte, ts time.Time, nonce string) hreq {
	t.Helper()
	enc, err := c.Encrypt(plain)
	if err != nil {
		t.Fatal(err)
	}
	return cb.signedEnc(c, enc, strconv.FormatInt(ts.Unix(), 10), nonce)
}

func (cb callbacks) signedEnc(c *wecom.Crypto, enc, ts, nonce string) hreq {
	q := url.Values{"msg_signature": {c.Signature(ts, nonce, enc)}, "timestamp": {ts}, "nonce": {nonce}}
	return hreq{method: http.MethodPost, url: cb.url + "?" + q.Encode(),
		header: http.Header{"Content-Type": {"text/xml"}},
		body:   wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: cb.corpID, Encrypt: enc})}
}

// withQuery returns r with its query replaced by raw.
func withQuery(r hreq, raw string) hreq {
	c := r.clone()
	base, _, _ := strings.Cut(c.url, "?")
	c.url = base + "?" + raw
	return c
}

func query(r hreq) url.Values {
	_, raw, _ := strings.Cut(r.url, "?")
	q, _ := url.ParseQuery(raw)
	return q
}

func billionLaughs(root string) string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">`)
	prev := "lol"
	for i := 1; i <= 9; i++ {
		name := "lol" + strconv.Itoa(i)
		fmt.Fprintf(&b, `<!ENTITY %s "%s">`, name, strings.Repeat("&"+prev+";", 10))
		prev = name
	}
	b.WriteString("]>")
	fmt.Fprintf(&b, "<xml><%s>&%s;</%s></xml>", root, prev, root)
	return b.String()
}

// TestHostileHTTP is scenario 8 (hostile-http): forged, replayed, malformed
// and oversized requests against the callback endpoint and the admin API
// of kf-producer and dlq-consumer as the daemons wire them. It asserts no
// 5xx, no sync triggered by anything but the legitimate callbacks (the
// trigger and callback metrics, and the tokens the fake WeChat was called
// with), and no admin state change without the operator role.
func TestHostileHTTP(t *testing.T) {
	start := time.Now()
	e := startEnv(t)
	ctx := context.Background()
	pc := e.pcfg
	cb := callbacks{url: e.prod.CallbackURL, corpID: pc.WeCom.CorpID,
		good: newCrypto(t, pc.Callback.Token, pc.Callback.EncodingAESKey, pc.WeCom.CorpID)}
	cbHost := strings.TrimPrefix(strings.TrimSuffix(cb.url, pc.Callback.Path), "http://")
	adminHost := strings.TrimPrefix(e.dlq.AdminURL, "http://")
	reg := e.pbase.Registry
	triggers := func() float64 { return counterSum(t, reg, "kfpipe_sync_triggers_total", "", "") }
	callbackOK := func() float64 {
		return counterSum(t, reg, "kfpipe_callback_requests_total", "result", wecom.ResultOK)
	}

	// ---- Legitimate traffic: the baseline every hostile request derives from.
	const kf = "wk-hostile"
	want := map[string][]string{}
	addMsgs := func(n int) {
		for i := 0; i < n; i++ {
			user := "hu-" + strconv.Itoa(i%3)
			want[user] = append(want[user], e.fake.AddText(kf, user, "hello "+strconv.Itoa(i)))
		}
	}
	legitTokens := map[string]bool{}
	var legit []hreq
	sendLegit := func(r hreq) {
		t.Helper()
		if code, body := e.do(t, r); code != http.StatusOK || string(body) != "success" {
			t.Fatalf("legitimate callback: %d %q", code, body)
		}
		legit = append(legit, r)
	}
	addMsgs(9)
	tok1 := e.fake.IssueToken(kf)
	legitTokens[tok1] = true
	now := time.Now()
	l1 := cb.signed(t, cb.good, kfEvent(cb.corpID, kf, tok1, now), now, nonce())
	sendLegit(l1)
	// The second one's nonce is itself a timestamp inside the window, so
	// the same signature verifies with timestamp and nonce swapped.
	addMsgs(6)
	tok2 := e.fake.IssueToken(kf)
	legitTokens[tok2] = true
	now = time.Now()
	l2 := cb.signed(t, cb.good, kfEvent(cb.corpID, kf, tok2, now), now.Add(-30*time.Second),
		strconv.FormatInt(now.Unix()+30, 10))
	sendLegit(l2)
	legitTriggers := float64(len(legit))
	if got, ok := triggers(), callbackOK(); got < legitTriggers || ok != legitTriggers {
		t.Fatalf("kfpipe_sync_triggers_total = %v, callbacks ok %v after %v legitimate callbacks", got, ok, legitTriggers)
	}

	// ---- Admin state worth protecting.
	letters := []*chatmsg.DeadLetter{
		chatmsg.NewDeadLetter(chatmsg.Source{Topic: pc.Kafka.Topics.Main.Name, Partition: 0, Offset: 1, Key: []byte("victim-1"), Value: []byte(`{}`)},
			dlq.ReasonRateLimited, "hostile seed", time.Now()),
		chatmsg.NewDeadLetter(chatmsg.Source{Topic: pc.Kafka.Topics.Main.Name, Partition: 0, Offset: 2, Key: []byte("victim-2"), Value: []byte(`not json`)},
			dlq.ReasonInvalidMessage, "hostile seed", time.Now()),
		chatmsg.NewDeadLetter(chatmsg.Source{Topic: pc.Kafka.Topics.Main.Name, Partition: 1, Offset: 3, Key: []byte("victim-3"), Value: []byte(`{}`)},
			dlq.ReasonDownstreamError, "hostile seed", time.Now()),
	}
	e.seedDLQ(t, letters)
	if err := e.dlq.Admin.Block(ctx, "blocked-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.dlq.Admin.Whitelist(ctx, "white-1"); err != nil {
		t.Fatal(err)
	}
	dlqBefore, err := e.dlq.Index.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap0, audit0 := e.snapshot(t), e.auditLen(t)
	if len(snap0) == 0 {
		t.Fatal("empty admin state snapshot: the comparison would prove nothing")
	}

	// ---- Callback: fixed hostile cases.
	forged := 0
	forgedEvent := func(c *wecom.Crypto, at time.Time) hreq {
		forged++
		return cb.signed(t, c, kfEvent(cb.corpID, kf, "forged-"+strconv.Itoa(forged), at), at, nonce())
	}
	wrongToken := newCrypto(t, "not-the-callback-token", pc.Callback.EncodingAESKey, pc.WeCom.CorpID)
	wrongCorp := newCrypto(t, pc.Callback.Token, pc.Callback.EncodingAESKey, "ww-evil-corp")
	q1 := query(l1)
	ts1, n1, s1 := q1.Get("timestamp"), q1.Get("nonce"), q1.Get("msg_signature")
	enc1 := func() string { env, _ := wecom.ParseEnvelope(l1.body); return env.Encrypt }()
	bodyOf := func(r hreq, b []byte) hreq { c := r.clone(); c.body = b; return c }
	withHeader := func(r hreq, k string, v ...string) hreq { c := r.clone(); c.header[k] = v; return c }
	withMethod := func(r hreq, m string) hreq { c := r.clone(); c.method = m; return c }
	swapped := func() hreq {
		q := query(l2)
		return withQuery(l2, url.Values{"msg_signature": {q.Get("msg_signature")}, "timestamp": {q.Get("nonce")},
			"nonce": {q.Get("timestamp")}}.Encode())
	}()
	hugeHeader := strings.Repeat("h", 2<<20)
	manyHeaders := l1.clone()
	for i := 0; i < 4000; i++ {
		manyHeaders.header.Set("X-Pad-"+strconv.Itoa(i), strings.Repeat("p", 400))
	}
	other := cb.signed(t, cb.good, []byte("<xml><MsgType>event</MsgType><Event>enter_session</Event></xml>"), time.Now(), nonce())
	echoPlain := "echo-" + nonce()
	echoEnc, _ := cb.good.Encrypt([]byte(echoPlain))
	echoTS := strconv.FormatInt(time.Now().Unix(), 10)
	echoQ := url.Values{"msg_signature": {cb.good.Signature(echoTS, "5", echoEnc)}, "timestamp": {echoTS}, "nonce": {"5"}, "echostr": {echoEnc}}

	type cbCase struct {
		name string
		req  hreq
		want []int
		body string // exact answer when set
	}
	cbCases := []cbCase{
		{"no query", withQuery(l1, ""), []int{401}, ""},
		{"missing signature", withQuery(l1, "timestamp="+ts1+"&nonce="+n1), []int{401}, ""},
		{"missing nonce", withQuery(l1, "msg_signature="+s1+"&timestamp="+ts1), []int{401}, ""},
		{"missing timestamp", withQuery(l1, "msg_signature="+s1+"&nonce="+n1), []int{401}, ""},
		{"zero signature", withQuery(l1, "msg_signature="+strings.Repeat("0", 40)+"&timestamp="+ts1+"&nonce="+n1), []int{401}, ""},
		{"signature of another body", bodyOf(l1, forgedEvent(cb.good, time.Now()).body), []int{401}, ""},
		{"signature with the wrong token", forgedEvent(wrongToken, time.Now()), []int{401}, ""},
		{"upper-case signature", func() hreq {
			r := forgedEvent(cb.good, time.Now())
			q := query(r)
			q.Set("msg_signature", strings.ToUpper(q.Get("msg_signature")))
			return withQuery(r, q.Encode())
		}(), []int{401}, ""},
		{"signed timestamp, another timestamp sent", withQuery(l1, "msg_signature="+s1+"&timestamp="+ts1+"0&nonce="+n1), []int{401}, ""},
		{"stale timestamp", forgedEvent(cb.good, time.Now().Add(-10*time.Minute)), []int{401}, ""},
		{"future timestamp", forgedEvent(cb.good, time.Now().Add(10*time.Minute)), []int{401}, ""},
		{"timestamp not a number", func() hreq {
			forged++
			enc, _ := cb.good.Encrypt(kfEvent(cb.corpID, kf, "forged-"+strconv.Itoa(forged), time.Now()))
			return cb.signedEnc(cb.good, enc, "17e8", "1")
		}(), []int{400}, ""},
		{"truncated body", bodyOf(l1, l1.body[:len(l1.body)/2]), []int{400}, ""},
		{"empty body", bodyOf(l1, nil), []int{400}, ""},
		{"truncated ciphertext, signed", cb.signedEnc(cb.good, enc1[:len(enc1)-8], strconv.FormatInt(time.Now().Unix(), 10), "3"), []int{400}, ""},
		{"body over 1 MiB", bodyOf(l1, bytes.Repeat([]byte("a"), pc.Callback.MaxBodyBytes+1)), []int{413}, ""},
		{"body over 1 MiB, chunked", func() hreq {
			r := bodyOf(l1, append([]byte("<xml><Encrypt>"), bytes.Repeat([]byte("A"), pc.Callback.MaxBodyBytes+1)...))
			r.chunked = true
			return r
		}(), []int{413}, ""},
		{"body of exactly the limit", bodyOf(l1, bytes.Repeat([]byte(" "), pc.Callback.MaxBodyBytes)), []int{400}, ""},
		{"malformed XML", bodyOf(l1, []byte("<xml><Encrypt>"+enc1+"</Encrypt")), []int{400}, ""},
		{"binary body", bodyOf(l1, []byte("\x00\xff\xfe<xml\x00>")), []int{400}, ""},
		{"billion laughs envelope", bodyOf(l1, []byte(billionLaughs("Encrypt"))), []int{400}, ""},
		{"external entity envelope", bodyOf(l1, []byte(`<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><xml><Encrypt>&e;</Encrypt></xml>`)), []int{400}, ""},
		{"billion laughs, encrypted and signed", cb.signed(t, cb.good, []byte(billionLaughs("MsgType")), time.Now(), nonce()), []int{400}, ""},
		{"deep nesting, encrypted and signed", cb.signed(t, cb.good, []byte(strings.Repeat("<a>", 150000)), time.Now(), nonce()), []int{400}, ""},
		{"wrong receive id", forgedEvent(wrongCorp, time.Now()), []int{400}, ""},
		{"kf event without open_kfid, signed", cb.signed(t, cb.good, kfEvent(cb.corpID, "", "forged-x", time.Now()), time.Now(), nonce()), []int{400}, ""},
		{"other event, authentic: acknowledged, ignored", other, []int{200}, "success"},
		{"replay", l1, []int{200}, "success"},
		{"replay again", l1, []int{200}, "success"},
		{"replay, other ToUserName", bodyOf(l1, wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: "evil", Encrypt: enc1, AgentID: "1"})), []int{200}, "success"},
		{"replay, forged duplicate parameters appended", withQuery(l1, query(l1).Encode()+"&msg_signature="+strings.Repeat("1", 40)+"&nonce=9"), []int{200}, "success"},
		{"forged parameters prepended", withQuery(l1, "msg_signature="+strings.Repeat("1", 40)+"&"+query(l1).Encode()), []int{401}, ""},
		{"replay, timestamp and nonce swapped", swapped, []int{200}, "success"},
		{"replay as JSON", withHeader(l1, "Content-Type", "application/json"), []int{200}, "success"},
		{"PUT", withMethod(forgedEvent(cb.good, time.Now()), http.MethodPut), []int{405}, ""},
		{"DELETE", withMethod(forgedEvent(cb.good, time.Now()), http.MethodDelete), []int{405}, ""},
		{"PATCH", withMethod(forgedEvent(cb.good, time.Now()), http.MethodPatch), []int{405}, ""},
		{"OPTIONS", withMethod(forgedEvent(cb.good, time.Now()), http.MethodOptions), []int{405}, ""},
		{"HEAD", withMethod(forgedEvent(cb.good, time.Now()), http.MethodHead), []int{405}, ""},
		{"URL check, authentic", hreq{method: http.MethodGet, url: cb.url + "?" + echoQ.Encode()}, []int{200}, echoPlain},
		{"URL check, forged signature", func() hreq {
			q := url.Values{}
			for k, v := range echoQ {
				q[k] = v
			}
			q.Set("msg_signature", wrongToken.Signature(echoTS, "5", echoEnc))
			return hreq{method: http.MethodGet, url: cb.url + "?" + q.Encode()}
		}(), []int{401}, ""},
		{"URL check, POST body ignored", hreq{method: http.MethodGet, url: cb.url + "?" + echoQ.Encode(), body: l1.body}, []int{200}, echoPlain},
		{"huge header", withHeader(l1, "X-Huge", hugeHeader), []int{431}, ""},
		{"many headers", manyHeaders, []int{431}, ""},
	}
	for _, c := range cbCases {
		// An event the callback accepts triggers a sync and counts as
		// ok; kfpipe_sync_triggers_total also moves by itself (the
		// producer's own triggers: an account discovered, a busy lock's
		// retry — a CI run saw one land during a case). The URL check
		// (GET) counts ok without a trigger.
		before := callbackOK()
		code, body := e.do(t, c.req)
		if got := callbackOK(); c.req.method != http.MethodGet && got != before {
			t.Errorf("callback %s: accepted, a sync triggered (%v → %v)", c.name, before, got)
		}
		if !slices.Contains(c.want, code) {
			t.Errorf("callback %s: status %d (%q), want %v", c.name, code, trunc(body), c.want)
		}
		if c.body != "" && string(body) != c.body {
			t.Errorf("callback %s: body %q, want %q", c.name, trunc(body), c.body)
		}
	}

	// Path tricks, byte for byte: replays of l1 (so reaching the handler by
	// any path can only be a replay) on paths no client library would send.
	_, l1q, _ := strings.Cut(l1.url, "?")
	for _, p := range []string{"/wecom/callback/../admin", "//wecom/callback", "/wecom/%2e%2e/wecom/callback",
		"/wecom/callback/", "/wecom/./callback", "/WECOM/CALLBACK", "/wecom/callback%00", "/wecom/callback;x=1",
		"/wecom/callback%2f", "/wecom/callback/..%2f..%2fadmin%2fdlq%2fpurge", "/../../wecom/callback",
		"/wecom/callback/" + strings.Repeat("a", 8000)} {
		reqText := "POST " + p + "?" + l1q + " HTTP/1.1\r\nHost: " + cbHost + "\r\nContent-Type: text/xml\r\nContent-Length: " +
			strconv.Itoa(len(l1.body)) + "\r\nConnection: close\r\n\r\n" + string(l1.body)
		code := e.raw(t, cbHost, reqText)
		e.count(code)
		if code >= 500 || (code == 200 && p != "/wecom/callback") {
			// 200 would mean the path reached the handler; it did not trigger
			// (checked below), but it must not happen for a path we don't serve.
			t.Errorf("callback path %q: status %d", p, code)
		}
	}
	// Malformed HTTP. Two answers are net/http's own, before any handler,
	// and the ones RFC 9112 prescribes: 501 for a transfer coding the
	// server does not implement, 505 for an HTTP version it does not
	// speak. They are protocol answers, not failures of ours, so they are
	// asserted exactly and not counted as 5xx.
	for _, c := range []struct {
		req      string
		want     []int
		protocol bool
	}{
		{"GET /wecom/callback HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nConnection: close\r\n\r\n0\r\n\r\n", []int{400}, false},
		{"POST /wecom/callback?" + l1q + " HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\nConnection: close\r\n\r\n", []int{400, 413}, false},
		{"POST /wecom/callback?" + l1q + " HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n", []int{400}, false},
		{"POST /wecom/callback?" + l1q + " HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nContent-Length: 20\r\nConnection: close\r\n\r\n", []int{400}, false},
		{"POST /wecom/callback?" + l1q + " HTTP/1.1\r\nConnection: close\r\n\r\n", []int{400}, false},                                                                         // no Host
		{"POST /wecom/callback?" + l1q + " HTTP/1.0\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(l1.body)) + "\r\n\r\n" + string(l1.body), []int{200}, false}, // a replay
		{"BREW /wecom/callback HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", []int{405}, false},
		{"POST /wecom/callback?" + l1q + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n0\r\n\r\n", []int{501}, true},
		{"POST /wecom/callback HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n", []int{505}, true},
	} {
		code := e.raw(t, cbHost, c.req)
		if c.protocol {
			e.sent.Add(1)
		} else {
			e.count(code)
		}
		if !slices.Contains(c.want, code) {
			t.Errorf("callback raw %q: status %d, want %v", firstLine(c.req), code, c.want)
		}
	}

	// ---- Admin API: every write route, with every way of not being an operator.
	op, viewer := operatorToken(t, e), viewerToken(t, e)
	id1 := letters[0].ID
	type route struct{ method, path, body string }
	writes := []route{
		{http.MethodPost, "/admin/dlq/retry/" + id1, `{"reason":"hostile"}`},
		{http.MethodPost, "/admin/dlq/batch-retry", `{"filter":{"all":true},"reason":"hostile"}`},
		{http.MethodPost, "/admin/dlq/purge", `{"filter":{"all":true},"reason":"hostile"}`},
		{http.MethodPost, "/admin/ratelimit/unblock/blocked-1", `{"reason":"hostile"}`},
		{http.MethodPost, "/admin/ratelimit/block/victim-1", `{"reason":"hostile","duration":"1h"}`},
		{http.MethodPost, "/admin/ratelimit/whitelist/victim-1", `{"reason":"hostile"}`},
		{http.MethodDelete, "/admin/ratelimit/whitelist/white-1", `{"reason":"hostile"}`},
		{http.MethodPut, "/admin/ratelimit/group/victim-1", `{"group":"vip","reason":"hostile"}`},
	}
	reads := []string{"/admin/dlq/stats", "/admin/dlq/messages", "/admin/dlq/messages/" + id1, "/admin/dlq/export",
		"/admin/ratelimit/status/blocked-1", "/admin/ratelimit/blocked"}
	adminReq := func(method, path string, auth []string, body string) hreq {
		h := http.Header{"Content-Type": {"application/json"}}
		if auth != nil {
			h["Authorization"] = auth
		}
		return hreq{method: method, url: e.dlq.AdminURL + path, header: h, body: []byte(body)}
	}
	type authCase struct {
		name string
		auth []string // Authorization values; nil: none
		want int
	}
	authCases := []authCase{
		{"no token", nil, 401},
		{"empty header", []string{""}, 401},
		{"scheme only", []string{"Bearer"}, 401},
		{"scheme and space", []string{"Bearer "}, 401},
		{"token without scheme", []string{op}, 401},
		{"basic", []string{"Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+op))}, 401},
		{"other scheme", []string{"Token " + op}, 401},
		{"prefix of the token", []string{"Bearer " + op[:len(op)-1]}, 401},
		{"short prefix", []string{"Bearer " + op[:4]}, 401},
		{"token plus suffix", []string{"Bearer " + op + "x"}, 401},
		{"prefix plus token", []string{"Bearer x" + op}, 401},
		{"upper-cased token", []string{"Bearer " + strings.ToUpper(op)}, 401},
		{"two tokens", []string{"Bearer " + op + "," + op}, 401},
		{"double space", []string{"Bearer  " + op}, 401},
		{"tab", []string{"Bearer\t" + op}, 401},
		{"token, space, junk", []string{"Bearer " + op + " x"}, 401},
		{"forged token", []string{"Bearer " + strings.Repeat("f", len(op))}, 401},
		{"huge token", []string{"Bearer " + strings.Repeat(op, 4000)}, 401},
		{"viewer", []string{"Bearer " + viewer}, 403},
		{"viewer, lower-case scheme", []string{"bearer " + viewer}, 403},
		{"viewer first, operator second", []string{"Bearer " + viewer, "Bearer " + op}, 403},
	}
	for _, w := range writes {
		for _, a := range authCases {
			if code, body := e.do(t, adminReq(w.method, w.path, a.auth, w.body)); code != a.want {
				t.Errorf("admin %s %s, %s: status %d (%s), want %d", w.method, w.path, a.name, code, trunc(body), a.want)
			}
		}
		va := []string{"Bearer " + viewer}
		for _, c := range []struct {
			name string
			req  hreq
			want []int
		}{
			{"viewer, text/plain", withHeader(adminReq(w.method, w.path, va, w.body), "Content-Type", "text/plain"), []int{403}},
			{"viewer, form", withHeader(adminReq(w.method, w.path, va, "reason=hostile"), "Content-Type", "application/x-www-form-urlencoded"), []int{403}},
			{"viewer, multipart", withHeader(adminReq(w.method, w.path, va, "--b\r\n\r\nx\r\n--b--"), "Content-Type", "multipart/form-data; boundary=b"), []int{403}},
			{"viewer, body too large", adminReq(w.method, w.path, va, `{"reason":"`+strings.Repeat("x", 100<<10)+`"}`), []int{403, 413}},
			{"viewer, unknown fields", adminReq(w.method, w.path, va, `{"reason":"x","role":"operator","as":"test-operator"}`), []int{403}},
			{"viewer, operator in query", adminReq(w.method, w.path+"?token="+url.QueryEscape(op)+"&access_token="+url.QueryEscape(op)+"&role=operator", va, w.body), []int{403}},
			{"viewer, X-Forwarded-User", withHeader(adminReq(w.method, w.path, va, w.body), "X-Forwarded-User", "test-operator"), []int{403}},
			{"viewer, GET with method override", withHeader(withHeader(withHeader(adminReq(http.MethodGet, w.path+"?_method="+w.method, va, w.body),
				"X-Http-Method-Override", w.method), "X-Method-Override", w.method), "X-Http-Method", w.method), []int{405}},
			{"viewer, POST with override to GET", withHeader(adminReq(w.method, w.path, va, w.body), "X-Http-Method-Override", "GET"), []int{403}},
			{"viewer, HEAD", adminReq(http.MethodHead, w.path, va, ""), []int{405}},
		} {
			if code, body := e.do(t, c.req); !slices.Contains(c.want, code) {
				t.Errorf("admin %s %s, %s: status %d (%s), want %v", w.method, w.path, c.name, code, trunc(body), c.want)
			}
		}
	}
	for _, p := range reads {
		for _, a := range authCases[:18] { // everything that is not a token
			code, body := e.do(t, adminReq(http.MethodGet, p, a.auth, ""))
			if code != 401 || bytes.Contains(body, []byte(id1)) || bytes.Contains(body, []byte("blocked-1")) {
				t.Errorf("admin GET %s, %s: status %d (%s), want 401 and no data", p, a.name, code, trunc(body))
			}
		}
	}
	// Path traversal and odd identifiers, as the viewer: never a write,
	// never a 5xx.
	va := []string{"Bearer " + viewer}
	long := strings.Repeat("A", 10000)
	for _, p := range []string{"/admin/dlq/messages/..%2f..%2fstats", "/admin/dlq/messages/..%2fmsg%2f" + id1,
		"/admin/dlq/messages/%00", "/admin/dlq/messages/a%00b", "/admin/dlq/messages/" + long,
		"/admin/dlq/messages/*", "/admin/dlq/messages/%2a", "/admin/ratelimit/status/..%2f..%2fblocked-1",
		"/admin/ratelimit/status/%0d%0aX-Injected:%201", "/admin/ratelimit/status/" + long,
		"/admin/dlq/messages?user=..%2f..%2f&reason=rate_limited", "/admin/dlq/messages?user=%00",
		"/admin/dlq/messages?limit=-1", "/admin/dlq/messages?limit=99999999999999999999", "/admin/dlq/messages?cursor=" + long[:600],
		"/admin/dlq/messages?cursor=..%2f..%2f", "/admin/dlq/export?reason=../../etc", "/admin/ratelimit/blocked?cursor=-5&limit=0",
	} {
		if code, body := e.do(t, adminReq(http.MethodGet, p, va, "")); code >= 500 {
			t.Errorf("admin GET %s: status %d (%s)", p, code, trunc(body))
		}
	}
	for _, w := range writes {
		base := w.path[:strings.LastIndexByte(w.path, '/')+1]
		for _, id := range []string{"..%2f..%2fpurge", "%2e%2e", "%00", long, "blocked-1%2f..%2f..%2fpurge"} {
			if code, body := e.do(t, adminReq(w.method, base+id, va, w.body)); code != 403 && code != 404 && code != 405 && code != 400 {
				t.Errorf("admin %s %s: status %d (%s)", w.method, base+id, code, trunc(body))
			}
		}
	}
	// The console is unauthenticated: its path must not lead anywhere else.
	for _, rt := range []string{
		"GET /admin/ui/../dlq/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /admin/ui/%2e%2e/dlq/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /admin/ui/..%2f..%2f..%2f..%2fetc%2fpasswd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /admin/ui/../../../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"POST /admin/ui/../dlq/purge HTTP/1.1\r\nHost: x\r\nContent-Length: 44\r\nConnection: close\r\n\r\n{\"filter\":{\"all\":true},\"reason\":\"hostile\"}  ",
		"POST /admin/ui/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"DELETE /admin/ui/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"POST http://evil.example/admin/dlq/purge HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer " + viewer + "\r\nContent-Length: 44\r\nConnection: close\r\n\r\n{\"filter\":{\"all\":true},\"reason\":\"hostile\"}  ",
		"POST /admin/dlq/purge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + viewer + "\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n0\r\n\r\n",
	} {
		code := e.raw(t, adminHost, rt)
		e.count(code)
		if code >= 500 || code == 200 && !strings.HasPrefix(rt, "GET /admin/ui/ ") {
			t.Errorf("admin raw %q: status %d", firstLine(rt), code)
		}
	}
	if code, _ := e.do(t, hreq{method: http.MethodGet, url: e.dlq.AdminURL + "/admin/dlq/stats",
		header: http.Header{"Authorization": {"Bearer " + viewer}, "X-Huge": {hugeHeader}}}); code != 431 {
		t.Errorf("admin huge header: status %d, want 431", code)
	}
	if d := diff(snap0, e.snapshot(t)); len(d) > 0 {
		t.Errorf("admin state changed by non-operator requests: %v", d)
	}

	// ---- Operator, but malformed: refused before anything is attempted,
	// so no write and no audit entry.
	oa := []string{"Bearer " + op}
	opCases := []struct {
		name string
		req  hreq
		want int
	}{
		{"body too large", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":"`+strings.Repeat("x", e.dcfg.Admin.MaxBodyBytes)+`"}`), 413},
		{"unknown field", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":"x","force":true}`), 400},
		{"malformed JSON", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":`), 400},
		{"two JSON values", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":"x"}{"reason":"y"}`), 400},
		{"array body", adminReq(http.MethodPost, writes[0].path, oa, `["reason"]`), 400},
		{"wrong type", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":5}`), 400},
		{"no reason", adminReq(http.MethodPost, writes[0].path, oa, `{}`), 422},
		{"reason too long", adminReq(http.MethodPost, writes[0].path, oa, `{"reason":"`+strings.Repeat("r", 2000)+`"}`), 422},
		{"form instead of JSON", withHeader(adminReq(http.MethodPost, writes[0].path, oa, "reason=x"), "Content-Type", "application/x-www-form-urlencoded"), 400},
		{"id with NUL", adminReq(http.MethodPost, "/admin/dlq/retry/a%00b", oa, `{"reason":"x"}`), 400},
		{"id too long", adminReq(http.MethodPost, "/admin/dlq/retry/"+long, oa, `{"reason":"x"}`), 400},
		{"user with CRLF", adminReq(http.MethodPost, "/admin/ratelimit/block/a%0d%0ab", oa, `{"reason":"x"}`), 400},
		{"user too long", adminReq(http.MethodPost, "/admin/ratelimit/unblock/"+long, oa, `{"reason":"x"}`), 400},
		{"purge without filter", adminReq(http.MethodPost, "/admin/dlq/purge", oa, `{"reason":"x"}`), 422},
		{"purge with empty filter", adminReq(http.MethodPost, "/admin/dlq/purge", oa, `{"filter":{},"reason":"x"}`), 422},
		{"purge, all plus user", adminReq(http.MethodPost, "/admin/dlq/purge", oa, `{"filter":{"all":true,"user":"victim-1"},"reason":"x"}`), 422},
		{"purge, unknown failure reason", adminReq(http.MethodPost, "/admin/dlq/purge", oa, `{"filter":{"reason":"*"},"reason":"x"}`), 422},
		{"batch, negative limit", adminReq(http.MethodPost, "/admin/dlq/batch-retry", oa, `{"filter":{"user":"victim-1","limit":-1},"reason":"x"}`), 422},
		{"block, negative duration", adminReq(http.MethodPost, "/admin/ratelimit/block/victim-1", oa, `{"reason":"x","duration":"-1h"}`), 422},
		{"block, endless duration", adminReq(http.MethodPost, "/admin/ratelimit/block/victim-1", oa, `{"reason":"x","duration":"99999999h"}`), 422},
		{"unknown group", adminReq(http.MethodPut, "/admin/ratelimit/group/victim-1", oa, `{"group":"root","reason":"x"}`), 422},
		{"GET on a write route", adminReq(http.MethodGet, "/admin/dlq/purge", oa, ""), 405},
	}
	for _, c := range opCases {
		if code, body := e.do(t, c.req); code != c.want {
			t.Errorf("admin operator %s: status %d (%s), want %d", c.name, code, trunc(body), c.want)
		}
	}
	if d := diff(snap0, e.snapshot(t)); len(d) > 0 {
		t.Errorf("admin state changed by refused operator requests: %v", d)
	}

	// ---- Randomized: mutations of the valid requests, bounded and seeded.
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KFPIPE_HOSTILE_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("KFPIPE_HOSTILE_SEED: %v", err)
		}
	}
	t.Logf("random phase seed %d (KFPIPE_HOSTILE_SEED=%d reproduces it)", seed, seed)
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m := mutator{rng: rng, legit: legit, cbPaths: []string{pc.Callback.Path}, writes: nil, op: op, viewer: viewer,
		adminURL: e.dlq.AdminURL, cbBase: strings.TrimSuffix(cb.url, pc.Callback.Path)}
	for _, w := range writes {
		m.writes = append(m.writes, [3]string{w.method, w.path, w.body})
	}
	for _, p := range reads {
		m.writes = append(m.writes, [3]string{http.MethodGet, p, ""})
	}
	deadline := time.Now().Add(randomBudget)
	random := 0
	for ; random < randomRequests && time.Now().Before(deadline); random++ {
		var r hreq
		if rng.IntN(2) == 0 {
			r = m.callback()
		} else {
			r = m.admin()
		}
		code, body, err := e.try(r)
		if err != nil {
			// The client refused to send it (an invalid header the mutation
			// made) or the server closed on a malformed request: no answer,
			// so nothing to check but that the server still serves (below).
			continue
		}
		if code >= 500 {
			t.Errorf("random #%d %s %s: status %d (%s)", random, r.method, trunc([]byte(r.url)), code, trunc(body))
		}
		if strings.HasPrefix(r.url, e.dlq.AdminURL) && r.method != http.MethodGet && r.method != http.MethodHead && code < 300 {
			t.Errorf("random #%d %s %s answered %d to a non-operator", random, r.method, trunc([]byte(r.url)), code)
		}
	}

	// ---- Verdict.
	if code, body := e.do(t, l1); code != 200 || string(body) != "success" {
		t.Errorf("after the hostile phase the callback answers %d %q to a replay", code, body)
	}
	snap1, audit1 := e.snapshot(t), e.auditLen(t)
	changed := diff(snap0, snap1)
	adminWrites := len(changed) + int(audit1-audit0)
	// kfpipe_callback_requests_total{result="ok"} counts every callback
	// that reached a sync trigger, and the two authentic URL checks. (Not
	// kfpipe_sync_triggers_total: kf-producer also triggers syncs itself —
	// a retry when a busy sync lock expires, an account it discovered.)
	forgedAccepted := int(callbackOK() - legitTriggers - 2)
	for _, c := range e.fake.SyncCalls() {
		if c.Token != "" && !legitTokens[c.Token] {
			forgedAccepted++
			t.Errorf("sync_msg called with token %q that no legitimate callback carried", c.Token)
		}
	}
	dlqAfter, err := e.dlq.Index.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dlqDelta := int(dlqAfter.Total - dlqBefore.Total)
	total := 0
	for _, ids := range want {
		total += len(ids)
	}
	lost, dup, reordered, detail := checkDelivery(want, e.mainTopicRecords(t, total))
	line := fmt.Sprintf("scenario=hostile-http sent=%d effects=%d dlq=%d lost=%d dup=%d reordered=%d duration=%s forged_accepted=%d admin_writes_without_operator=%d status_5xx=%d",
		e.sent.Load(), forgedAccepted+adminWrites, dlqDelta, lost, dup, reordered, time.Since(start).Round(time.Millisecond),
		forgedAccepted, adminWrites, e.status5x.Load())
	fmt.Println(line)
	if forgedAccepted != 0 || adminWrites != 0 || e.status5x.Load() != 0 || dlqDelta != 0 || lost+dup+reordered != 0 {
		t.Errorf("%s\nchanged keys %v, audit %d → %d, triggers %v (legitimate %v), delivery: %s",
			line, changed, audit0, audit1, triggers(), legitTriggers, detail)
	}

	// ---- Control: the same write requests with the operator token do
	// change the state and are audited, so the checks above could fail.
	for _, w := range writes {
		if code, body := e.do(t, adminReq(w.method, w.path, oa, w.body)); code != 200 {
			t.Errorf("control: operator %s %s: status %d (%s)", w.method, w.path, code, trunc(body))
		}
	}
	if n := e.auditLen(t) - audit1; n != int64(len(writes)) {
		t.Errorf("control: %d audit entries for %d operator writes", n, len(writes))
	}
	if len(diff(snap1, e.snapshot(t))) == 0 {
		t.Error("control: operator writes changed nothing the snapshot sees")
	}
}

func trunc(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
