package wecom_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
)

// memReplay is an in-process ReplayCache: the fuzzer needs the replay path
// without a Redis round trip per input (TestCallbackReplay covers Redis).
type memReplay struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (m *memReplay) FirstSeen(_ context.Context, key string, _ time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen[key] {
		return false, nil
	}
	m.seen[key] = true
	return true, nil
}

// How FuzzCallbackHandler turns its inputs into a request.
const (
	fuzzRaw         = iota // query and body as given: nothing is signed
	fuzzSignBody           // sign the Encrypt of the given body with the right token
	fuzzEncryptKF          // body is the plaintext event: encrypt, wrap, sign
	fuzzEncryptEcho        // body is the echostr plaintext of a GET URL check
	fuzzModes
)

var fuzzMethods = []string{http.MethodPost, http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPatch,
	http.MethodHead, http.MethodOptions, "PROPFIND"}

// FuzzCallbackHandler runs the real callback handler (signature, timestamp
// window, replay cache, body cap, decrypt, parse) on fuzzed query strings
// and bodies. Modes let the fuzzer reach the code behind the signature:
// the harness signs (or encrypts and signs) what the fuzzer produced.
// Properties: never a 5xx; a trigger only for a request whose signature
// verifies over the Encrypt it carries, inside the timestamp window, that
// decrypts to a kf_msg_or_event naming the triggered open_kfid and token,
// never twice for one (timestamp, nonce, signature); a correctly encrypted
// and signed kf_msg_or_event is always triggered; a GET answers only the
// decrypted echostr of a verified request.
func FuzzCallbackHandler(f *testing.F) {
	c, err := wecom.NewCrypto(vecToken, vecAESKey, vecReceiveID)
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	kf := string(kfEvent("wk-fuzz", "tok-fuzz"))
	enc, _ := c.Encrypt([]byte(kf))
	validQ := url.Values{"msg_signature": {c.Signature(ts, "42", enc)}, "timestamp": {ts}, "nonce": {"42"}}.Encode()
	env := string(wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: vecReceiveID, Encrypt: enc}))
	// A delivery whose nonce is itself a timestamp inside the window, and
	// the same delivery with timestamp and nonce swapped: the signature
	// sorts its parts before hashing, so it verifies for both.
	ts2, nonce2 := strconv.FormatInt(now.Unix()-30, 10), strconv.FormatInt(now.Unix()+30, 10)
	enc2, _ := c.Encrypt(kfEvent("wk-swap", "tok-swap"))
	env2 := string(wecom.MarshalEnvelopeXML(&wecom.Envelope{Encrypt: enc2}))
	sig2 := c.Signature(ts2, nonce2, enc2)
	seeds := []struct {
		mode   uint8
		method uint8
		query  string
		body   string
	}{
		{fuzzRaw, 0, validQ, env}, // valid as it stands: the raw path must accept it too
		{fuzzRaw, 0, validQ + "&nonce=43", env},
		{fuzzRaw, 0, "msg_signature=" + strings.Repeat("0", 40) + "&timestamp=" + ts + "&nonce=1", env},
		{fuzzRaw, 0, vecPostQuery, vecPostBody},
		{fuzzRaw, 0, "msg_signature=" + sig2 + "&timestamp=" + ts2 + "&nonce=" + nonce2, env2},
		{fuzzRaw, 0, "msg_signature=" + sig2 + "&timestamp=" + nonce2 + "&nonce=" + ts2, env2},
		{fuzzRaw, 1, vecVerifyQuery, ""},
		{fuzzRaw, 2, validQ, env},
		{fuzzRaw, 0, "msg_signature=a&timestamp=%zz&nonce=;;", "<xml><Encrypt>" + strings.Repeat("A", 5000) + "</Encrypt></xml>"},
		{fuzzSignBody, 0, "nonce=7", env},
		{fuzzSignBody, 0, "nonce=7", "<xml><Encrypt><![CDATA[" + strings.Repeat("A", 44) + "]]></Encrypt></xml>"},
		{fuzzSignBody, 0, "nonce=7&timestamp=1", env},
		{fuzzSignBody, 0, "nonce=7", `<!DOCTYPE x [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><xml><Encrypt>&b;</Encrypt></xml>`},
		{fuzzEncryptKF, 0, "nonce=8", kf},
		{fuzzEncryptKF, 0, "nonce=8", "<xml><MsgType>event</MsgType><Event>kf_msg_or_event</Event><OpenKfId></OpenKfId></xml>"},
		{fuzzEncryptKF, 0, "nonce=8", "<xml><MsgType>event</MsgType><Event>change</Event></xml>"},
		{fuzzEncryptKF, 0, "nonce=8", `<!DOCTYPE x [<!ENTITY a "aaaa">]><xml><MsgType>&a;</MsgType></xml>`},
		{fuzzEncryptKF, 0, "nonce=8", "<xml><CreateTime>1e9</CreateTime><MsgType>event</MsgType></xml>"},
		{fuzzEncryptKF, 0, "nonce=8", strings.Repeat("<a>", 20000)},
		{fuzzEncryptEcho, 1, "nonce=9", "echo-123"},
		{fuzzEncryptEcho, 1, "nonce=9", ""},
	}
	for _, s := range seeds {
		f.Add(s.mode, s.method, s.query, []byte(s.body))
	}

	var (
		mu       sync.Mutex
		triggers []triggerCall
	)
	trigger := func(_ context.Context, openKfID, token string) {
		mu.Lock()
		defer mu.Unlock()
		triggers = append(triggers, triggerCall{openKfID, token})
	}
	const window = 5 * time.Minute
	replay := &memReplay{seen: map[string]bool{}}
	h := wecom.NewCallbackHandler(wecom.CallbackConfig{MaxBodyBytes: 8192, TimestampWindow: window,
		ReplayWindow: time.Minute, Clock: func() time.Time { return now }}, c, replay, trigger)
	seenKeys := map[string]bool{} // the oracle's own replay memory

	f.Fuzz(func(t *testing.T, mode, methodSel uint8, rawQuery string, body []byte) {
		mode %= fuzzModes
		if len(seenKeys) > 100000 { // both memories forget together: bounded for long runs
			seenKeys = map[string]bool{}
			replay.mu.Lock()
			replay.seen = map[string]bool{}
			replay.mu.Unlock()
		}
		method := fuzzMethods[int(methodSel)%len(fuzzMethods)]
		q, _ := url.ParseQuery(rawQuery)
		nonce := q.Get("nonce")
		if nonce == "" {
			nonce = "1"
		}
		sign := func(enc string) {
			if q.Get("timestamp") == "" {
				q.Set("timestamp", ts)
			}
			q.Set("nonce", nonce)
			q.Set("msg_signature", c.Signature(q.Get("timestamp"), nonce, enc))
			rawQuery = q.Encode()
		}
		switch mode {
		case fuzzSignBody:
			if e, err := wecom.ParseEnvelope(body); err == nil {
				sign(e.Encrypt)
			}
		case fuzzEncryptKF:
			e, err := c.Encrypt(body)
			if err != nil {
				t.Fatal(err)
			}
			body = wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: vecReceiveID, Encrypt: e})
			sign(e)
			method = http.MethodPost
		case fuzzEncryptEcho:
			e, err := c.Encrypt(body)
			if err != nil {
				t.Fatal(err)
			}
			q.Set("echostr", e)
			sign(e)
			method, body = http.MethodGet, nil
		}

		req := httptest.NewRequest(method, "/wecom/callback", bytes.NewReader(body))
		req.URL.RawQuery = rawQuery // set directly: a fuzzed query must not make NewRequest panic
		mu.Lock()
		before := len(triggers)
		mu.Unlock()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		mu.Lock()
		got := append([]triggerCall(nil), triggers[before:]...)
		mu.Unlock()

		if rec.Code >= 500 {
			t.Fatalf("%s ?%s %q: status %d %q", method, rawQuery, body, rec.Code, rec.Body)
		}
		// The oracle: what an authentic, fresh request looks like.
		sq := req.URL.Query()
		sig, tss, nc := sq.Get("msg_signature"), sq.Get("timestamp"), sq.Get("nonce")
		inWindow := func() bool {
			n, err := strconv.ParseInt(tss, 10, 64)
			if err != nil {
				return false
			}
			d := now.Sub(time.Unix(n, 0))
			return d <= window && d >= -window
		}
		switch method {
		case http.MethodPost:
			var ev *wecom.Event
			fresh := false
			if e, err := wecom.ParseEnvelope(body); err == nil && len(body) <= 8192 && sig != "" && nc != "" &&
				c.Verify(sig, tss, nc, e.Encrypt) && inWindow() {
				if plain, err := c.Decrypt(e.Encrypt); err == nil {
					if x, err := wecom.ParseEvent(plain); err == nil {
						ev = x
						// One delivery is one signature: any other split of
						// the signed parts is the same delivery again.
						key := sig
						fresh = !seenKeys[key]
						seenKeys[key] = true
					}
				}
			}
			if len(got) > 0 {
				if ev == nil || !ev.IsKFMsgOrEvent() || !fresh {
					t.Fatalf("?%s %q: triggered %v without an authentic fresh kf_msg_or_event", rawQuery, body, got)
				}
				if len(got) != 1 || got[0] != (triggerCall{ev.OpenKfID, ev.Token}) {
					t.Fatalf("?%s %q: triggered %v for %+v", rawQuery, body, got, ev)
				}
			}
			if ev != nil && ev.IsKFMsgOrEvent() && fresh && len(got) != 1 {
				t.Fatalf("?%s %q: authentic fresh event %+v answered %d %q without a trigger", rawQuery, body, ev, rec.Code, rec.Body)
			}
			if rec.Code == http.StatusOK && (ev == nil || rec.Body.String() != "success") {
				t.Fatalf("?%s %q: 200 %q for a request that is not authentic", rawQuery, body, rec.Body)
			}
		case http.MethodGet:
			if len(got) > 0 {
				t.Fatalf("GET ?%s triggered %v", rawQuery, got)
			}
			if rec.Code == http.StatusOK {
				echo := strings.ReplaceAll(sq.Get("echostr"), " ", "+")
				plain, err := c.Decrypt(echo)
				if !c.Verify(sig, tss, nc, echo) || !inWindow() || err != nil || !bytes.Equal(plain, rec.Body.Bytes()) {
					t.Fatalf("GET ?%s answered 200 %q", rawQuery, rec.Body)
				}
			}
		default:
			if len(got) > 0 || rec.Code != http.StatusMethodNotAllowed {
				t.Fatalf("%s: %d, triggers %v", method, rec.Code, got)
			}
		}
	})
}
