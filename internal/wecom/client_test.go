package wecom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

func newFake(t *testing.T, opts wecomtest.Options) *wecomtest.Server {
	t.Helper()
	s := wecomtest.New(opts)
	t.Cleanup(s.Close)
	return s
}

func newClient(t *testing.T, s *wecomtest.Server, tokens wecom.TokenCache) *wecom.Client {
	t.Helper()
	c, err := wecom.NewClient(wecom.ClientConfig{BaseURL: s.URL(), CorpID: s.CorpID(), Secret: s.Secret(), Timeout: 2 * time.Second},
		tokens, wecom.WithRetryBackoff(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientTokenSharedInRedis(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newFake(t, wecomtest.Options{})
	s.AddText("wk-1", "u1", "hi")
	ctx := context.Background()
	// Two replicas sharing one Redis fetch one token between them.
	a := newClient(t, s, wecom.NewRedisTokenCache(rdb, prefix))
	b := newClient(t, s, wecom.NewRedisTokenCache(rdb, prefix))
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		for _, c := range []*wecom.Client{a, b} {
			wg.Go(func() {
				if _, err := c.SyncMsg(ctx, wecom.SyncRequest{OpenKfID: "wk-1"}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait() // the first round fetches; every later one hits the cache
	}
	if got := s.Counts(); got.GetToken > 2 || got.SyncMsg != 20 {
		// Both replicas may race on the very first fetch, never more.
		t.Fatalf("counts = %+v, want GetToken <= 2, SyncMsg 20", got)
	}
	key := prefix + "wecom:token:" + wecom.TokenFingerprint(s.CorpID(), s.Secret())
	ttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := 7200*time.Second - 5*time.Minute; ttl > want || ttl < want-time.Minute {
		t.Fatalf("token TTL = %v, want about %v", ttl, want)
	}
	if v := rdb.Get(ctx, key).Val(); v == "" || strings.Contains(key, s.Secret()) {
		t.Fatalf("token %q under %q", v, key)
	}
}

func TestTokenFingerprint(t *testing.T) {
	fp := wecom.TokenFingerprint("corp", "secret")
	if len(fp) != 16 || fp == wecom.TokenFingerprint("corp", "secret2") || fp != wecom.TokenFingerprint("corp", "secret") {
		t.Fatalf("fingerprint %q", fp)
	}
}

func TestClientAccessTokenRejected(t *testing.T) {
	tests := []struct {
		name         string
		setup        func(s *wecomtest.Server)
		wantErr      func(error) bool
		wantGetToken int
		wantSyncMsg  int
	}{
		{"40014 once: refetch and succeed", func(s *wecomtest.Server) { s.FailNext(1, wecom.CodeInvalidAccessToken) }, nil, 2, 2},
		{"42001 once: refetch and succeed", func(s *wecomtest.Server) { s.FailNext(1, wecom.CodeAccessTokenExpired) }, nil, 2, 2},
		{"token really expired", func(s *wecomtest.Server) { s.ExpireTokens() }, nil, 2, 2},
		{"40014 twice: refetch only once", func(s *wecomtest.Server) { s.FailNext(2, wecom.CodeInvalidAccessToken) },
			wecom.IsAccessTokenInvalid, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, prefix := testenv.Redis(t)
			s := newFake(t, wecomtest.Options{Accounts: []string{"wk-1"}})
			c := newClient(t, s, wecom.NewRedisTokenCache(rdb, prefix))
			ctx := context.Background()
			if _, err := c.AccessToken(ctx); err != nil { // warm the cache
				t.Fatal(err)
			}
			tt.setup(s)
			_, err := c.SyncMsg(ctx, wecom.SyncRequest{OpenKfID: "wk-1"})
			if tt.wantErr == nil && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != nil && !tt.wantErr(err) {
				t.Fatalf("err = %v", err)
			}
			if got := s.Counts(); got.GetToken != tt.wantGetToken || got.SyncMsg != tt.wantSyncMsg {
				t.Fatalf("counts = %+v, want GetToken %d SyncMsg %d", got, tt.wantGetToken, tt.wantSyncMsg)
			}
		})
	}
}

func TestClientErrors(t *testing.T) {
	tests := []struct {
		name        string
		setup       func(s *wecomtest.Server)
		req         wecom.SyncRequest
		check       func(error) bool
		wantSyncMsg int
	}{
		{"-1 twice then ok", func(s *wecomtest.Server) { s.FailNext(2, wecom.CodeSystemBusy) }, wecom.SyncRequest{OpenKfID: "wk-1"},
			func(err error) bool { return err == nil }, 3},
		{"-1 three times: give up after 3 tries", func(s *wecomtest.Server) { s.FailNext(5, wecom.CodeSystemBusy) }, wecom.SyncRequest{OpenKfID: "wk-1"},
			func(err error) bool { var ae *wecom.APIError; return errors.As(err, &ae) && ae.Code == -1 }, 3},
		{"95007 injected", func(s *wecomtest.Server) { s.FailNext(1, wecom.CodeInvalidMsgToken) }, wecom.SyncRequest{OpenKfID: "wk-1"},
			wecom.IsTokenExpired, 1},
		{"95007 unknown callback token", func(*wecomtest.Server) {}, wecom.SyncRequest{OpenKfID: "wk-1", Token: "forged"},
			wecom.IsTokenExpired, 1},
		{"95007 expired callback token", nil, wecom.SyncRequest{OpenKfID: "wk-1"}, wecom.IsTokenExpired, 1},
		{"45009", func(s *wecomtest.Server) { s.FailNext(1, wecom.CodeRateLimited) }, wecom.SyncRequest{OpenKfID: "wk-1"},
			wecom.IsRateLimited, 1},
		{"95000 unknown open_kfid", func(*wecomtest.Server) {}, wecom.SyncRequest{OpenKfID: "wk-nobody"},
			wecom.IsInvalidOpenKfID, 1},
		{"bad cursor", func(*wecomtest.Server) {}, wecom.SyncRequest{OpenKfID: "wk-1", Cursor: "garbage!"},
			func(err error) bool {
				var ae *wecom.APIError
				return errors.As(err, &ae) && ae.Code == wecom.CodeInvalidParameter
			}, 1},
		{"empty open_kfid refused locally", func(*wecomtest.Server) {}, wecom.SyncRequest{},
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "open_kfid") }, 0},
		{"limit over 1000 refused locally", func(*wecomtest.Server) {}, wecom.SyncRequest{OpenKfID: "wk-1", Limit: 1001},
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "limit") }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFake(t, wecomtest.Options{Accounts: []string{"wk-1"}})
			c := newClient(t, s, nil)
			if tt.setup == nil { // the expired-callback-token case
				tt.req.Token = s.IssueToken("wk-1")
				s.ExpireCallbackTokens()
			} else {
				tt.setup(s)
			}
			_, err := c.SyncMsg(context.Background(), tt.req)
			if !tt.check(err) {
				t.Fatalf("err = %v", err)
			}
			if got := s.Counts().SyncMsg; got != tt.wantSyncMsg {
				t.Fatalf("sync_msg requests = %d, want %d", got, tt.wantSyncMsg)
			}
		})
	}
}

func TestClientGetTokenErrors(t *testing.T) {
	s := newFake(t, wecomtest.Options{Accounts: []string{"wk-1"}})
	ctx := context.Background()

	s.FailNextToken(1, wecom.CodeSystemBusy)
	if _, err := newClient(t, s, nil).AccessToken(ctx); err != nil {
		t.Fatalf("gettoken after one -1: %v", err)
	}

	bad, err := wecom.NewClient(wecom.ClientConfig{BaseURL: s.URL(), CorpID: s.CorpID(), Secret: "wrong"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.SyncMsg(ctx, wecom.SyncRequest{OpenKfID: "wk-1"})
	var ae *wecom.APIError
	if !errors.As(err, &ae) || ae.Code != wecom.CodeInvalidCredential {
		t.Fatalf("wrong secret: %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error leaks the secret: %v", err)
	}
}

// TestClientNoSecretInTransportErrors: net/http quotes the URL in its
// errors, and our URLs carry the secret or the access token.
func TestClientNoSecretInTransportErrors(t *testing.T) {
	dead := httptest.NewServer(nil)
	url := dead.URL
	dead.Close()
	c, err := wecom.NewClient(wecom.ClientConfig{BaseURL: url, CorpID: "corp", Secret: "s3cr3t-value"}, nil,
		wecom.WithRetryBackoff(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-1"})
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "corpsecret") {
		t.Fatalf("err = %v", err)
	}
}

func TestClientTimeout(t *testing.T) {
	s := newFake(t, wecomtest.Options{Accounts: []string{"wk-1"}})
	c, err := wecom.NewClient(wecom.ClientConfig{BaseURL: s.URL(), CorpID: s.CorpID(), Secret: s.Secret(), Timeout: 50 * time.Millisecond},
		nil, wecom.WithRetryBackoff(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AccessToken(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.SetLatency(300 * time.Millisecond)
	start := time.Now()
	_, err = c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-1"})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 290*time.Millisecond { // 3 tries × 50 ms + backoff, well under the latency
		t.Fatalf("took %v", d)
	}
}

// TestClientRedisDown: a token cache that fails is bypassed, not fatal.
func TestClientRedisDown(t *testing.T) {
	dead := httptest.NewServer(nil)
	addr := dead.Listener.Addr().String()
	dead.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newFake(t, wecomtest.Options{Accounts: []string{"wk-1"}})
	c := newClient(t, s, wecom.NewRedisTokenCache(rdb, "x:"))
	if _, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-1"}); err != nil {
		t.Fatal(err)
	}
}

// syncAll pages like the producer does: until has_more is 0, through empty
// pages, returning the messages and the final cursor.
func syncAll(t *testing.T, c *wecom.Client, kf, cursor string, limit int) ([]*chatmsg.ChatMessage, string, int) {
	t.Helper()
	var all []*chatmsg.ChatMessage
	pages := 0
	for {
		resp, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: kf, Cursor: cursor, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(resp.MsgList) > limit {
			t.Fatalf("page of %d > limit %d", len(resp.MsgList), limit)
		}
		all = append(all, resp.MsgList...)
		cursor = resp.NextCursor
		if !resp.More() {
			return all, cursor, pages
		}
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
	}
}

func TestClientPaging(t *testing.T) {
	s := newFake(t, wecomtest.Options{})
	c := newClient(t, s, nil)
	var want []string
	for i := 0; i < 25; i++ {
		want = append(want, s.AddText("wk-1", fmt.Sprintf("u%d", i%3), fmt.Sprintf("m%d", i)))
	}
	s.EmptyPages(2) // WeChat may answer has_more=1 with nothing in the page
	got, cursor, pages := syncAll(t, c, "wk-1", "", 10)
	if pages != 5 { // 2 empty + 10 + 10 + 5
		t.Fatalf("pages = %d, want 5", pages)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		b, err := m.Body()
		if m.UpstreamMsgID != want[i] || err != nil || b.Text != fmt.Sprintf("m%d", i) || m.OpenKfID != "wk-1" || m.ExternalUserID != fmt.Sprintf("u%d", i%3) {
			t.Fatalf("message %d = %+v (%+v, %v)", i, m, b, err)
		}
	}
	if cursor != s.LastCursor("wk-1") {
		t.Fatalf("final cursor %q != LastCursor %q", cursor, s.LastCursor("wk-1"))
	}

	// Resuming from the stored cursor returns only what came after.
	newer := s.AddText("wk-1", "u9", "late")
	got, cursor, _ = syncAll(t, c, "wk-1", cursor, 10)
	if len(got) != 1 || got[0].UpstreamMsgID != newer || cursor != s.LastCursor("wk-1") {
		t.Fatalf("resume got %v, cursor %q", got, cursor)
	}
	// Nothing new: an empty final page with the same position.
	got, cursor2, _ := syncAll(t, c, "wk-1", cursor, 10)
	if len(got) != 0 || cursor2 != cursor {
		t.Fatalf("idle sync got %d messages, cursor %q → %q", len(got), cursor, cursor2)
	}
	// A cursor of another account is refused, not misread.
	s.AddAccount("wk-2")
	if _, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-2", Cursor: cursor}); err == nil {
		t.Fatal("cursor of wk-1 accepted for wk-2")
	}
	// The request carried what the docs require.
	calls := s.SyncCalls()
	if last := calls[0]; last.OpenKfID != "wk-1" || last.Limit != 10 {
		t.Fatalf("sync call = %+v", last)
	}
}

func TestClientRetention(t *testing.T) {
	clk := testenv.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s := newFake(t, wecomtest.Options{Clock: clk.Now})
	c := newClient(t, s, nil)
	old := s.AddText("wk-1", "u1", "old")
	cursorBefore := s.Cursor("wk-1", 0)
	clk.Advance(71 * time.Hour)
	mid := s.AddText("wk-1", "u1", "mid")
	clk.Advance(2 * time.Hour) // "old" is now 73 h old
	recent := s.AddText("wk-1", "u1", "recent")
	_ = old

	for _, cursor := range []string{"", cursorBefore} {
		got, _, _ := syncAll(t, c, "wk-1", cursor, 1000)
		if len(got) != 2 || got[0].UpstreamMsgID != mid || got[1].UpstreamMsgID != recent {
			t.Fatalf("cursor %q: got %d messages %v, want [mid recent]", cursor, len(got), got)
		}
	}
}

// TestSyncMsgItems: SyncMsg reads each item once into the record the
// producer sends (chatmsg.ParseItem): an unknown type whole, an event's
// ids from inside "event", and the items it cannot key in Invalid, with
// the rest of the page intact.
func TestSyncMsgItems(t *testing.T) {
	s := newFake(t, wecomtest.Options{})
	c := newClient(t, s, nil)
	unknown := `{"msgtype":"channels_shop_product","external_userid":"u1","origin":3,"channels_shop_product":{"product_id":"10000","title":"t","nested":{"x":[1,2,3]}}}`
	s.Append("wk-1", json.RawMessage(unknown))
	eventID := s.AddEvent("wk-1", "u2", "enter_session")
	// A servicer going on duty concerns no customer: it cannot be keyed.
	noUser := s.Append("wk-1", json.RawMessage(`{"origin":4,"msgtype":"event","event":{"event_type":"servicer_status_change","open_kfid":"wk-1","servicer_userid":"alice","status":1}}`))[0]
	after := s.AddText("wk-1", "u3", "after")

	resp, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-1"})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.MsgList
	if len(got) != 3 || got[2].UpstreamMsgID != after {
		t.Fatalf("got %d messages: %+v", len(got), got)
	}
	if len(resp.Invalid) != 1 || !errors.Is(resp.Invalid[0], chatmsg.ErrMissingField) ||
		!strings.Contains(resp.Invalid[0].Error(), "external_userid") || !strings.Contains(string(resp.Invalid[0].Item), noUser) {
		t.Fatalf("invalid = %+v", resp.Invalid)
	}

	u := got[0]
	if u.MsgType != "channels_shop_product" || u.ExternalUserID != "u1" || u.OpenKfID != "wk-1" || u.UpstreamMsgID == "" || u.SendTime == 0 ||
		u.MessageID != 0 || u.ProducedAt != 0 {
		t.Fatalf("unknown type = %+v", u)
	}
	var raw map[string]any
	if err := json.Unmarshal(u.Content, &raw); err != nil {
		t.Fatal(err)
	}
	prod, _ := raw["channels_shop_product"].(map[string]any)
	if prod["product_id"] != "10000" || prod["nested"] == nil {
		t.Fatalf("content lost the unknown body: %s", u.Content)
	}
	if b, err := u.Body(); err != nil || b != (chatmsg.Body{}) {
		t.Fatalf("body of an unknown type = %+v, %v", b, err)
	}

	e := got[1]
	b, err := e.Body()
	if e.UpstreamMsgID != eventID || err != nil || !b.HasEvent || b.Event.Type != "enter_session" || b.Event.ExternalUserID != "u2" {
		t.Fatalf("event = %+v %+v %v", e, b, err)
	}
	// For events the identities sit inside "event"; the record's fields
	// are filled from there so the producer can key by user.
	if e.OpenKfID != "wk-1" || e.ExternalUserID != "u2" || e.Origin != wecom.OriginEvent {
		t.Fatalf("event top-level fields = %+v", e)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(e.Content, &top); err != nil {
		t.Fatal(err)
	}
	if _, has := top["open_kfid"]; has {
		t.Fatalf("event item has a top-level open_kfid, unlike WeChat: %s", e.Content)
	}
}

func TestClientConfigValidate(t *testing.T) {
	ok := wecom.ClientConfig{BaseURL: "https://qyapi.weixin.qq.com", CorpID: "c", Secret: "s"}
	tests := []struct {
		mut  func(*wecom.ClientConfig)
		want string
	}{
		{func(c *wecom.ClientConfig) { c.BaseURL = "" }, "wecom.base_url"},
		{func(c *wecom.ClientConfig) { c.BaseURL = "qyapi.weixin.qq.com" }, "wecom.base_url"},
		{func(c *wecom.ClientConfig) { c.CorpID = "" }, "wecom.corp_id"},
		{func(c *wecom.ClientConfig) { c.Secret = " " }, "wecom.secret"},
		{func(c *wecom.ClientConfig) { c.Timeout = -1 }, "wecom.request_timeout"},
		{func(*wecom.ClientConfig) {}, ""},
	}
	for _, tt := range tests {
		cfg := ok
		tt.mut(&cfg)
		_, err := wecom.NewClient(cfg, nil)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("NewClient(%+v) = %v, want %q", cfg, err, tt.want)
		}
	}
}

func BenchmarkSyncMsg(b *testing.B) {
	s := wecomtest.New(wecomtest.Options{})
	defer s.Close()
	for i := 0; i < 1000; i++ {
		s.AddText("wk-1", fmt.Sprintf("u%d", i%50), strings.Repeat("x", 64))
	}
	c, err := wecom.NewClient(wecom.ClientConfig{BaseURL: s.URL(), CorpID: s.CorpID(), Secret: s.Secret()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.SyncMsg(context.Background(), wecom.SyncRequest{OpenKfID: "wk-1", Limit: 1000})
		if err != nil || len(resp.MsgList) != 1000 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "msgs/s")
}
