package wecomtest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func getJSON(t *testing.T, method, u, body string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func errcode(m map[string]any) int { f, _ := m["errcode"].(float64); return int(f) }

// TestRawProtocol checks the fake's answers at the HTTP level, as WeChat
// documents them, independently of wecom.Client.
func TestRawProtocol(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	s := wecomtest.New(wecomtest.Options{Clock: clk.now, Accounts: []string{"wk-1"}})
	defer s.Close()
	tokURL := func(corp, secret string) string {
		return s.URL() + "/cgi-bin/gettoken?" + url.Values{"corpid": {corp}, "corpsecret": {secret}}.Encode()
	}
	if got := errcode(getJSON(t, "GET", tokURL("other", s.Secret()), "")); got != wecom.CodeInvalidCorpID {
		t.Fatalf("wrong corpid: %d", got)
	}
	if got := errcode(getJSON(t, "GET", tokURL(s.CorpID(), "nope"), "")); got != wecom.CodeInvalidCredential {
		t.Fatalf("wrong secret: %d", got)
	}
	tr := getJSON(t, "GET", tokURL(s.CorpID(), s.Secret()), "")
	tok, _ := tr["access_token"].(string)
	if errcode(tr) != 0 || tok == "" || tr["expires_in"].(float64) != 7200 {
		t.Fatalf("gettoken = %v", tr)
	}
	clk.add(time.Hour)
	if again := getJSON(t, "GET", tokURL(s.CorpID(), s.Secret()), ""); again["access_token"] != tok || again["expires_in"].(float64) != 3600 {
		t.Fatalf("gettoken within the lifetime = %v, want the same token with 3600 s left", again)
	}
	clk.add(-time.Hour)
	sync := func(token, body string) map[string]any {
		return getJSON(t, "POST", s.URL()+"/cgi-bin/kf/sync_msg?access_token="+url.QueryEscape(token), body)
	}
	tests := []struct {
		name, token, body string
		want              int
	}{
		{"ok", tok, `{"open_kfid":"wk-1"}`, 0},
		{"no access token", "", `{"open_kfid":"wk-1"}`, wecom.CodeMissingAccessToken},
		{"unknown access token", "abc", `{"open_kfid":"wk-1"}`, wecom.CodeInvalidAccessToken},
		{"bad json", tok, `{`, 47001},
		{"no open_kfid", tok, `{}`, wecom.CodeInvalidOpenKfID},
		{"unknown open_kfid", tok, `{"open_kfid":"wk-x"}`, wecom.CodeInvalidOpenKfID},
		{"limit too big", tok, `{"open_kfid":"wk-1","limit":1001}`, wecom.CodeInvalidParameter},
		{"negative limit", tok, `{"open_kfid":"wk-1","limit":-1}`, wecom.CodeInvalidParameter},
		{"cursor beyond the log", tok, `{"open_kfid":"wk-1","cursor":"` + s.Cursor("wk-1", 5) + `"}`, wecom.CodeInvalidParameter},
		{"unknown msg token", tok, `{"open_kfid":"wk-1","token":"x"}`, wecom.CodeInvalidMsgToken},
	}
	for _, tt := range tests {
		if got := errcode(sync(tt.token, tt.body)); got != tt.want {
			t.Errorf("%s: errcode %d, want %d", tt.name, got, tt.want)
		}
	}

	// Callback tokens live 10 minutes.
	msgTok := s.IssueToken("wk-1")
	clk.add(9 * time.Minute)
	if got := errcode(sync(tok, `{"open_kfid":"wk-1","token":"`+msgTok+`"}`)); got != 0 {
		t.Fatalf("fresh msg token: %d", got)
	}
	clk.add(2 * time.Minute)
	if got := errcode(sync(tok, `{"open_kfid":"wk-1","token":"`+msgTok+`"}`)); got != wecom.CodeInvalidMsgToken {
		t.Fatalf("11-minute-old msg token: %d", got)
	}
	// Access tokens expire after expires_in.
	clk.add(2 * time.Hour)
	if got := errcode(sync(tok, `{"open_kfid":"wk-1"}`)); got != wecom.CodeAccessTokenExpired {
		t.Fatalf("old access token: %d", got)
	}
	if c := s.Counts(); c.GetToken != 4 || c.SyncMsg != len(tests)+3 {
		t.Fatalf("counts = %+v", c)
	}
}

// TestNotifyEndToEnd: the fake announces messages through the real callback
// handler, and the token it put in the callback works for sync_msg.
func TestNotifyEndToEnd(t *testing.T) {
	const token, aesKey = "cbtoken", "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
	crypto, err := wecom.NewCrypto(token, aesKey, wecomtest.DefaultCorpID)
	if err != nil {
		t.Fatal(err)
	}
	type trig struct{ kf, tok string }
	got := make(chan trig, 1)
	h := wecom.NewCallbackHandler(wecom.CallbackConfig{TimestampWindow: time.Minute}, crypto, nil,
		func(_ context.Context, kf, tok string) { got <- trig{kf, tok} })
	cb := httptest.NewServer(h)
	defer cb.Close()

	s := wecomtest.New(wecomtest.Options{Callback: &wecomtest.CallbackSender{URL: cb.URL, Token: token, AESKey: aesKey,
		CorpID: wecomtest.DefaultCorpID}})
	defer s.Close()
	id := s.AddText("wk-1", "u1", "hello")
	sent, err := s.Notify(context.Background(), "wk-1")
	if err != nil {
		t.Fatal(err)
	}
	tr := <-got
	if tr.kf != "wk-1" || tr.tok != sent {
		t.Fatalf("trigger %+v, sent token %q", tr, sent)
	}
	c, err := wecom.NewClient(wecom.ClientConfig{BaseURL: s.URL(), CorpID: s.CorpID(), Secret: s.Secret()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: tr.kf, Token: tr.tok})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.MsgList) != 1 || resp.MsgList[0].UpstreamMsgID != id || resp.More() {
		t.Fatalf("sync = %+v", resp)
	}
	if calls := s.SyncCalls(); len(calls) != 1 || calls[0].Token != sent || calls[0].OpenKfID != "wk-1" {
		t.Fatalf("calls = %+v", calls)
	}
}

func TestAppendFillsFields(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	s := wecomtest.NewHandler(wecomtest.Options{Clock: clk.now})
	ids := s.Append("wk-1",
		json.RawMessage(`{"msgid":"given","external_userid":"u1","msgtype":"text","origin":3}`),
		json.RawMessage(`{"msgtype":"image","external_userid":"u1","image":{"media_id":"m"},"send_time":5}`))
	if len(ids) != 2 || ids[0] != "given" || ids[1] == "" {
		t.Fatalf("ids = %v", ids)
	}
	msgs := s.Messages("wk-1")
	if msgs[0].OpenKfID != "wk-1" || msgs[0].SendTime != 1_700_000_000 || msgs[1].SendTime != 5 || msgs[1].UpstreamMsgID != ids[1] {
		t.Fatalf("messages = %+v", msgs)
	}
	if !strings.Contains(string(msgs[1].Content), `"media_id":"m"`) {
		t.Fatalf("raw = %s", msgs[1].Content)
	}
	if s.Len("wk-1") != 2 || s.LastCursor("wk-1") != s.Cursor("wk-1", 2) {
		t.Fatal("Len/LastCursor disagree")
	}
}

// TestAddServicerText: a servicer's message is in the log with origin 5
// and its servicer.
func TestAddServicerText(t *testing.T) {
	s := wecomtest.NewHandler(wecomtest.Options{})
	id := s.AddServicerText("wk-1", "u1", "alice", "Hi, I am Alice")
	msgs := s.Messages("wk-1")
	if len(msgs) != 1 || msgs[0].UpstreamMsgID != id || msgs[0].Origin != wecom.OriginServicer || msgs[0].ServicerUserID != "alice" ||
		msgs[0].ExternalUserID != "u1" || msgs[0].MsgType != "text" || !strings.Contains(string(msgs[0].Content), "Hi, I am Alice") {
		t.Fatalf("messages = %+v", msgs)
	}
}

// TestAddMenuClick: a tap on a menu item is the customer's text carrying
// the item's menu_id.
func TestAddMenuClick(t *testing.T) {
	s := wecomtest.NewHandler(wecomtest.Options{})
	id := s.AddMenuClick("wk-1", "u1", "shipping", "Shipping")
	msgs := s.Messages("wk-1")
	if len(msgs) != 1 || msgs[0].UpstreamMsgID != id || msgs[0].Origin != wecom.OriginCustomer || msgs[0].MsgType != "text" ||
		!strings.Contains(string(msgs[0].Content), `"menu_id":"shipping"`) {
		t.Fatalf("messages = %+v", msgs)
	}
}

// TestReplyQuota: 5 messages after each of the customer's, none before
// they wrote.
func TestReplyQuota(t *testing.T) {
	s := wecomtest.New(wecomtest.Options{Accounts: []string{"wk"}})
	defer s.Close()
	if left, end := s.ReplyQuota("wk", "u1"); left != 0 || !end.IsZero() {
		t.Fatalf("before the customer wrote: %d left, window end %v", left, end)
	}
	s.AddText("wk", "u1", "hi")
	if left, end := s.ReplyQuota("wk", "u1"); left != 5 || time.Until(end) < 47*time.Hour {
		t.Fatalf("after the customer's message: %d left, window end %v; want 5 and 48 h", left, end)
	}
}

// TestDelayAnswersActsFirst: with DelayAnswers a send_msg is delivered
// before its slow answer leaves, so a client that gives up meanwhile
// fails while the customer has the message (as with WeChat).
func TestDelayAnswersActsFirst(t *testing.T) {
	s := wecomtest.New(wecomtest.Options{Accounts: []string{"wk"}})
	defer s.Close()
	s.AddText("wk", "u1", "hi")
	tr := getJSON(t, "GET", s.URL()+"/cgi-bin/gettoken?"+url.Values{"corpid": {s.CorpID()}, "corpsecret": {s.Secret()}}.Encode(), "")
	tok, _ := tr["access_token"].(string)
	s.DelayAnswers(wecomtest.APISendMsg, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/cgi-bin/kf/send_msg?access_token="+url.QueryEscape(tok),
		strings.NewReader(`{"touser":"u1","open_kfid":"wk","msgid":"m1","msgtype":"text","text":{"content":"hello"}}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the answer came back before the client gave up")
	}
	if n := len(s.Replies("wk", "u1")); n != 1 {
		t.Fatalf("delivered %d messages, want 1 (delivered before the slow answer)", n)
	}
}
