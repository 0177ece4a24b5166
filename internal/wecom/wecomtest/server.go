// Package wecomtest is a fake WeChat Work server for tests and the demo:
// gettoken, kf/sync_msg with real cursor paging over a per-open_kfid
// message log, callback tokens, injected errors and latency, and a
// CallbackSender that signs and encrypts callbacks exactly like WeChat.
//
// It follows WeChat's documented behaviour where the pipeline depends on
// it: access tokens expire (42001) or are unknown (40014); callback tokens
// live 10 minutes (95007 afterwards); messages are readable for 3 days;
// limit is at most 1000; has_more may be 1 on a page with no messages.
package wecomtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Defaults of Options.
const (
	DefaultCorpID      = "wwfakecorp0000001"
	DefaultSecret      = "fake-kf-secret"
	DefaultTokenTTL    = 7200 * time.Second
	DefaultMsgTokenTTL = 10 * time.Minute
	DefaultRetention   = 72 * time.Hour
)

// Options configures the fake server. Zero values take the defaults.
type Options struct {
	CorpID   string
	Secret   string
	TokenTTL time.Duration // access-token lifetime (expires_in)
	// MsgTokenTTL is how long a callback token is accepted by sync_msg.
	MsgTokenTTL time.Duration
	// Retention is how far back sync_msg still returns messages.
	Retention time.Duration
	// Clock drives token expiry, send_time and retention; nil ⇒ time.Now.
	Clock func() time.Time
	// Accounts are the open_kfids that exist from the start; AddAccount,
	// Append and IssueToken add more. sync_msg on any other ⇒ 95000.
	Accounts []string
	// Callback, when set, is what Notify uses to call the callback URL.
	Callback *CallbackSender
	// ReplyQuota is how many messages may be sent after each message of
	// a customer; 0 ⇒ WeChat's 5. Only a benchmark that answers many
	// messages of one user from a backlog raises it.
	ReplyQuota int
}

// Counts are request counters by API.
type Counts struct {
	GetToken int
	SyncMsg  int
}

// SyncCall records one sync_msg request as the fake received it.
type SyncCall struct {
	OpenKfID    string
	Cursor      string
	Token       string
	Limit       int
	VoiceFormat int
	ErrCode     int
}

type entry struct {
	raw      json.RawMessage
	sendTime int64
}

// Server is the fake WeChat Work API. Its methods are safe for concurrent
// use with the requests it serves.
type Server struct {
	opts Options
	ts   *httptest.Server

	mu           sync.Mutex
	accessTokens map[string]time.Time // token → expiry
	current      string               // the token gettoken hands out
	msgTokens    map[string]time.Time // callback token → expiry
	accounts     map[string]bool
	logs         map[string][]entry
	failSync     []int
	failToken    []int
	emptyPages   int
	latency      time.Duration
	counts       Counts
	calls        []SyncCall
	seq          int
	kfs          *kfState       // the reply side (kf.go)
	accs         *accountsState // the account side (accounts.go)
	failSend     []int
	media        *mediaState              // inbound media (media.go)
	faults       map[string][]int         // FailCalls: API → errcodes to answer
	answerDelay  map[string]time.Duration // DelayAnswers: API → delay after acting
	arrived      map[string]time.Time     // msgid → when Append took it (ReceivedAt)
}

// New starts a fake server on a loopback port; Close stops it.
func New(opts Options) *Server {
	s := NewHandler(opts)
	s.ts = httptest.NewServer(s)
	return s
}

// NewHandler returns the fake without a listener, to mount it elsewhere
// (the demo serves it on its own port); URL and Close are then no-ops.
func NewHandler(opts Options) *Server {
	if opts.CorpID == "" {
		opts.CorpID = DefaultCorpID
	}
	if opts.Secret == "" {
		opts.Secret = DefaultSecret
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = DefaultTokenTTL
	}
	if opts.MsgTokenTTL == 0 {
		opts.MsgTokenTTL = DefaultMsgTokenTTL
	}
	if opts.Retention == 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &Server{
		opts:         opts,
		accessTokens: make(map[string]time.Time),
		msgTokens:    make(map[string]time.Time),
		accounts:     make(map[string]bool),
		logs:         make(map[string][]entry),
	}
	for _, a := range opts.Accounts {
		s.accounts[a] = true
	}
	return s
}

// URL is the base URL to put in wecom.ClientConfig.BaseURL.
func (s *Server) URL() string {
	if s.ts == nil {
		return ""
	}
	return s.ts.URL
}

// Close stops the server and waits for its requests to finish.
func (s *Server) Close() {
	if s.ts != nil {
		s.ts.Close()
	}
}

// CorpID returns the corp ID the server accepts.
func (s *Server) CorpID() string { return s.opts.CorpID }

// Secret returns the secret the server accepts.
func (s *Server) Secret() string { return s.opts.Secret }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	lat := s.latency
	s.mu.Unlock()
	if lat > 0 {
		t := time.NewTimer(lat)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	if d := s.answerDelayOf(r); d > 0 {
		// Runs after the call was carried out and its answer written
		// (buffered until the handler returns).
		defer time.Sleep(d)
	}
	if s.injectFault(w, r) {
		return
	}
	if s.serveAccounts(w, r) {
		return
	}
	switch r.URL.Path {
	case "/cgi-bin/gettoken":
		s.getToken(w, r)
	case "/cgi-bin/media/get":
		s.getMedia(w, r)
	case "/cgi-bin/kf/sync_msg", "/cgi-bin/kf/send_msg", "/cgi-bin/kf/send_msg_on_event",
		"/cgi-bin/kf/service_state/get", "/cgi-bin/kf/service_state/trans", "/cgi-bin/kf/customer/batchget",
		"/cgi-bin/media/upload":
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Path {
		case "/cgi-bin/kf/sync_msg":
			s.syncMsg(w, r)
		case "/cgi-bin/kf/send_msg":
			s.sendMsg(w, r, false)
		case "/cgi-bin/kf/send_msg_on_event":
			s.sendMsg(w, r, true)
		case "/cgi-bin/kf/customer/batchget":
			s.customers(w, r)
		case "/cgi-bin/media/upload":
			s.uploadMedia(w, r)
		default:
			s.serviceState(w, r, r.URL.Path == "/cgi-bin/kf/service_state/trans")
		}
	default:
		http.NotFound(w, r)
	}
}

// SetLatency delays every response by d.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// DelayAnswers makes every call of api (an API… constant, or any path
// after /cgi-bin/) answer d after it was carried out: WeChat acted — a
// send_msg delivered its message — and its answer is slow to come back,
// so a client that gives up meanwhile does not know that it acted (0
// ends the delay). SetLatency, by contrast, delays a call before it is
// looked at, and a call its client gave up on is not carried out.
func (s *Server) DelayAnswers(api string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answerDelay == nil {
		s.answerDelay = map[string]time.Duration{}
	}
	s.answerDelay[api] = d
}

func (s *Server) answerDelayOf(r *http.Request) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answerDelay[strings.TrimPrefix(r.URL.Path, "/cgi-bin/")]
}

// FailNext makes the next n sync_msg requests fail with errcode (40014,
// 42001, 95007, 45009, -1 …) before any other check.
func (s *Server) FailNext(n, errcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < n; i++ {
		s.failSync = append(s.failSync, errcode)
	}
}

// FailNextToken makes the next n gettoken requests fail with errcode.
func (s *Server) FailNextToken(n, errcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < n; i++ {
		s.failToken = append(s.failToken, errcode)
	}
}

// EmptyPages makes the next n successful sync_msg responses carry no
// messages, has_more 1 and a cursor at the same position, as WeChat
// sometimes answers.
func (s *Server) EmptyPages(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emptyPages += n
}

// ExpireTokens expires every access token issued so far (42001).
func (s *Server) ExpireTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	past := s.opts.Clock().Add(-time.Second)
	for t := range s.accessTokens {
		s.accessTokens[t] = past
	}
}

// ExpireCallbackTokens expires every callback token issued so far (95007).
func (s *Server) ExpireCallbackTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	past := s.opts.Clock().Add(-time.Second)
	for t := range s.msgTokens {
		s.msgTokens[t] = past
	}
}

// Counts returns the request counters.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// SyncCalls returns every sync_msg request received, in order.
func (s *Server) SyncCalls() []SyncCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]SyncCall(nil), s.calls...)
}

// AddAccount makes openKfID a known customer-service account.
func (s *Server) AddAccount(openKfID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accounts[openKfID] = true
}

// IssueToken returns a fresh callback token, as WeChat puts in a
// kf_msg_or_event callback for openKfID.
func (s *Server) IssueToken(openKfID string) string {
	tok := "ENC" + randHex(12)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accounts[openKfID] = true
	s.msgTokens[tok] = s.opts.Clock().Add(s.opts.MsgTokenTTL)
	return tok
}

// Notify issues a callback token for openKfID and sends the
// kf_msg_or_event callback with Options.Callback, as WeChat does when a
// user writes. It returns the token sent.
func (s *Server) Notify(ctx context.Context, openKfID string) (string, error) {
	if s.opts.Callback == nil {
		return "", fmt.Errorf("wecomtest: Notify needs Options.Callback")
	}
	tok := s.IssueToken(openKfID)
	resp, err := s.opts.Callback.SendEvent(ctx, openKfID, tok)
	if err != nil {
		return tok, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return tok, fmt.Errorf("wecomtest: callback answered %s", resp.Status)
	}
	return tok, nil
}

// AddText appends a text message from externalUserID and returns its msgid.
func (s *Server) AddText(openKfID, externalUserID, content string) string {
	raw, _ := json.Marshal(map[string]any{
		"open_kfid": openKfID, "external_userid": externalUserID, "origin": wecom.OriginCustomer,
		"msgtype": "text", "text": map[string]any{"content": content},
	})
	return s.Append(openKfID, raw)[0]
}

// AddMenuClick appends the customer's tap on the item menuID of a menu
// the bot sent: a text message whose text carries the item's content and
// its menu_id, as WeChat delivers it. It returns the msgid.
func (s *Server) AddMenuClick(openKfID, externalUserID, menuID, content string) string {
	raw, _ := json.Marshal(map[string]any{
		"open_kfid": openKfID, "external_userid": externalUserID, "origin": wecom.OriginCustomer,
		"msgtype": "text", "text": map[string]any{"content": content, "menu_id": menuID},
	})
	return s.Append(openKfID, raw)[0]
}

// AddServicerText appends a text message a servicer (servicerUserID)
// sent to externalUserID from the WeCom client (origin 5), which reaches
// the pipeline like a customer's; it returns its msgid.
func (s *Server) AddServicerText(openKfID, externalUserID, servicerUserID, content string) string {
	raw, _ := json.Marshal(map[string]any{
		"open_kfid": openKfID, "external_userid": externalUserID, "origin": wecom.OriginServicer,
		"servicer_userid": servicerUserID, "msgtype": "text", "text": map[string]any{"content": content},
	})
	return s.Append(openKfID, raw)[0]
}

// AddEvent appends an event item (enter_session …); as in WeChat,
// open_kfid and external_userid sit inside "event". It returns the msgid.
func (s *Server) AddEvent(openKfID, externalUserID, eventType string) string {
	raw, _ := json.Marshal(map[string]any{
		"origin": wecom.OriginEvent, "msgtype": "event",
		"event": map[string]any{"event_type": eventType, "open_kfid": openKfID, "external_userid": externalUserID},
	})
	return s.Append(openKfID, raw)[0]
}

// Append adds items to openKfID's log and returns their msgids. An item
// is any JSON object in WeChat's shape (so unknown types and broken items
// can be tested); a missing msgid, send_time (now) and top-level
// open_kfid (except for events) are filled in.
func (s *Server) Append(openKfID string, items ...json.RawMessage) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accounts[openKfID] = true
	ids := make([]string, 0, len(items))
	for _, raw := range items {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
			panic(fmt.Sprintf("wecomtest: Append: item is not a JSON object: %s", raw))
		}
		id := jsonString(obj["msgid"])
		if id == "" {
			s.seq++
			id = fmt.Sprintf("msg%06d%s", s.seq, randHex(4))
			obj["msgid"], _ = json.Marshal(id)
		}
		var sendTime int64
		_ = json.Unmarshal(obj["send_time"], &sendTime)
		if sendTime == 0 {
			sendTime = s.opts.Clock().Unix()
			obj["send_time"], _ = json.Marshal(sendTime)
		}
		if _, isEvent := obj["event"]; !isEvent && jsonString(obj["open_kfid"]) == "" {
			obj["open_kfid"], _ = json.Marshal(openKfID)
		}
		if s.arrived == nil {
			s.arrived = map[string]time.Time{}
		}
		s.arrived[id] = s.opts.Clock()
		s.noteIncoming(openKfID, obj, sendTime)
		out, _ := json.Marshal(obj)
		s.logs[openKfID] = append(s.logs[openKfID], entry{raw: out, sendTime: sendTime})
		ids = append(ids, id)
	}
	return ids
}

// ReceivedAt is when the fake took the message msgid into openKfID's log
// (its send_time, to the nanosecond); zero for an unknown msgid.
func (s *Server) ReceivedAt(openKfID, msgID string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrived[msgID]
}

// Len returns how many messages openKfID's log holds (expired included).
func (s *Server) Len(openKfID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.logs[openKfID])
}

// Messages returns openKfID's log as the client's SyncMsg reads it
// (chatmsg.ParseItem), expired messages included: new records each call,
// without MessageID and ProducedAt. Items ParseItem refuses are left out,
// as SyncMsg leaves them out of MsgList.
func (s *Server) Messages(openKfID string) []*chatmsg.ChatMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*chatmsg.ChatMessage, 0, len(s.logs[openKfID]))
	for _, e := range s.logs[openKfID] {
		if m, err := chatmsg.ParseItem(e.raw); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// LastCursor is the cursor after the last message of openKfID: what a
// consumer that has read everything has stored.
func (s *Server) LastCursor(openKfID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return encodeCursor(openKfID, len(s.logs[openKfID]))
}

// Cursor is the cursor before message i (0-based) of openKfID's log.
func (s *Server) Cursor(openKfID string, i int) string { return encodeCursor(openKfID, i) }

// The cursor is opaque to clients, like WeChat's (at most 64 bytes): base64
// of the position and a short hash of the open_kfid it belongs to, so a
// cursor of another account is rejected instead of silently misread.
func encodeCursor(openKfID string, pos int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(pos) + "|" + kfHash(openKfID)))
}

func kfHash(openKfID string) string {
	sum := sha256.Sum256([]byte(openKfID))
	return hex.EncodeToString(sum[:4])
}

func decodeCursor(openKfID, c string) (int, bool) {
	if c == "" {
		return 0, true
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, false
	}
	p, h, ok := strings.Cut(string(b), "|")
	if !ok || h != kfHash(openKfID) {
		return 0, false
	}
	pos, err := strconv.Atoi(p)
	if err != nil || pos < 0 {
		return 0, false
	}
	return pos, true
}

func (s *Server) getToken(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.GetToken++
	if len(s.failToken) > 0 {
		code := s.failToken[0]
		s.failToken = s.failToken[1:]
		writeErr(w, code, "injected")
		return
	}
	q := r.URL.Query()
	switch {
	case q.Get("corpid") != s.opts.CorpID:
		writeErr(w, wecom.CodeInvalidCorpID, "invalid corpid")
		return
	case q.Get("corpsecret") != s.opts.Secret:
		writeErr(w, wecom.CodeInvalidCredential, "invalid credential")
		return
	}
	// As WeChat documents: within its lifetime the same token is returned
	// (with the remaining lifetime); a new one only after it expired.
	now := s.opts.Clock()
	if s.current != "" {
		if left := s.accessTokens[s.current].Sub(now); left >= time.Second {
			writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "access_token": s.current,
				"expires_in": int64(left / time.Second)})
			return
		}
	}
	s.current = randHex(32)
	s.accessTokens[s.current] = now.Add(s.opts.TokenTTL)
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "access_token": s.current,
		"expires_in": int64(s.opts.TokenTTL / time.Second)})
}

type syncBody struct {
	Cursor      string `json:"cursor"`
	Token       string `json:"token"`
	Limit       *int   `json:"limit"`
	VoiceFormat int    `json:"voice_format"`
	OpenKfID    string `json:"open_kfid"`
}

func (s *Server) syncMsg(w http.ResponseWriter, r *http.Request) {
	var body syncBody
	decErr := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.SyncMsg++
	call := SyncCall{OpenKfID: body.OpenKfID, Cursor: body.Cursor, Token: body.Token, VoiceFormat: body.VoiceFormat}
	if body.Limit != nil {
		call.Limit = *body.Limit
	}
	fail := func(code int, msg string) {
		call.ErrCode = code
		s.calls = append(s.calls, call)
		writeErr(w, code, msg)
	}
	if len(s.failSync) > 0 {
		code := s.failSync[0]
		s.failSync = s.failSync[1:]
		fail(code, "injected")
		return
	}
	now := s.opts.Clock()
	tok := r.URL.Query().Get("access_token")
	exp, known := s.accessTokens[tok]
	switch {
	case tok == "":
		fail(wecom.CodeMissingAccessToken, "access_token missing")
		return
	case !known:
		fail(wecom.CodeInvalidAccessToken, "invalid access_token")
		return
	case !now.Before(exp):
		fail(wecom.CodeAccessTokenExpired, "access_token expired")
		return
	case decErr != nil:
		fail(47001, "data format error")
		return
	case body.OpenKfID == "" || !s.accounts[body.OpenKfID]:
		fail(wecom.CodeInvalidOpenKfID, "invalid open_kfid")
		return
	}
	if body.Token != "" {
		if exp, ok := s.msgTokens[body.Token]; !ok || !now.Before(exp) {
			fail(wecom.CodeInvalidMsgToken, "invalid msg token")
			return
		}
	}
	limit := wecom.MaxSyncLimit
	if body.Limit != nil && *body.Limit != 0 {
		limit = *body.Limit
	}
	if limit < 1 || limit > wecom.MaxSyncLimit {
		fail(wecom.CodeInvalidParameter, "invalid limit")
		return
	}
	pos, ok := decodeCursor(body.OpenKfID, body.Cursor)
	log := s.logs[body.OpenKfID]
	if !ok || pos > len(log) {
		// WeChat does not document the code of a bad cursor; 40058 is its
		// generic invalid-parameter code.
		fail(wecom.CodeInvalidParameter, "invalid cursor")
		return
	}
	s.calls = append(s.calls, call)

	items := []json.RawMessage{}
	if s.emptyPages > 0 {
		s.emptyPages--
		writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "next_cursor": encodeCursor(body.OpenKfID, pos),
			"has_more": 1, "msg_list": items})
		return
	}
	// Messages older than the retention window are gone: skip them.
	oldest := now.Add(-s.opts.Retention).Unix()
	for pos < len(log) && log[pos].sendTime < oldest {
		pos++
	}
	end := min(pos+limit, len(log))
	for _, e := range log[pos:end] {
		items = append(items, e.raw)
	}
	hasMore := 0
	if end < len(log) {
		hasMore = 1
	}
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "next_cursor": encodeCursor(body.OpenKfID, end),
		"has_more": hasMore, "msg_list": items})
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, map[string]any{"errcode": code, "errmsg": msg})
}

// writeJSON answers 200 like WeChat, whose errors are in the body.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(v)
}

func jsonString(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
