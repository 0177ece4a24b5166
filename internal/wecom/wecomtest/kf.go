package wecomtest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
)

// The reply side of the customer-service API, modelled on WeChat's rules:
//
//   - send_msg: the customer must have written within the last 48 hours
//     (95002), and at most 5 messages may be sent after each message of the
//     customer (95001); a session that ended refuses messages (95013); an
//     unknown account is 95000, an unknown customer 40096.
//   - send_msg: a text's content is at most 2048 bytes (45002); a
//     ca_link needs an https link_url.
//   - send_msg_on_event: the welcome_code of an enter_session event, valid
//     20 seconds and once (95017); text or msgmenu only.
//   - service_state/get and /trans: states 0 untreated, 1 bot, 2 queue,
//     3 servicer, 4 ended; the transitions WeChat documents (95016 else).
//     A change to 2, 3 or 4 returns a msg_code for send_msg_on_event
//     (valid 20 seconds, once, like a welcome_code).
//   - send_msg while a human servicer holds the session (state 3) is
//     95018 (session status invalid): the API may not talk over the
//     servicer. ServicerTakes and ServicerEnds change the state as a
//     servicer does from the WeCom client and append the
//     session_status_change event WeChat sends (with its msg_code).
//   - customer/batchget: 1–100 external_userids; the ones the fake has seen
//     write come back with a nickname, the others in invalid_external_userid.
//   - media/upload: type image (≤ 10 MB), voice, video or file, as the
//     multipart field "media"; send_msg with an image, link or miniprogram
//     whose media_id was not uploaded is 40007.
//   - A msgid given with a message is kept; the same msgid again for the
//     account is not delivered a second time (counted by DuplicateMsgIDs).
//     Whether WeChat itself refuses or ignores a repeated msgid is not
//     documented: kfpipe does not rely on it (its replies are claimed and
//     marked like any effect), and the count shows what reached the fake.
//
// Every delivered message is recorded (Replies) with its msgid.

// Reply is one message the fake delivered to a customer.
type Reply struct {
	OpenKfID, User string
	MsgID          string
	MsgType        string
	Body           json.RawMessage // the request's message object ("text": {...})
	OnEvent        bool            // sent with send_msg_on_event
	At             time.Time
}

// Transfer is one accepted service_state/trans.
type Transfer struct {
	OpenKfID, User string
	From, To       int
	Servicer       string
	At             time.Time
	// ByServicer: a servicer's own change from the WeCom client
	// (ServicerTakes, ServicerEnds), not an API call.
	ByServicer bool
}

const (
	replyQuota     = 5
	replyWindow    = 48 * time.Hour
	welcomeCodeTTL = 20 * time.Second
)

type session struct {
	state     int
	servicer  string
	quota     int       // messages left until the customer writes again
	windowEnd time.Time // 48 h after the customer's last message
}

type welcome struct {
	openKfID, user string
	expires        time.Time
	used           bool
}

// kfState is the fake's reply-side state (guarded by Server.mu).
type kfState struct {
	sessions  map[string]*session // openKfID + "/" + user
	welcomes  map[string]*welcome
	msgIDs    map[string]bool // openKfID + "/" + msgid
	media     map[string]bool // uploaded media_ids
	replies   []Reply
	transfers []Transfer
	dups      []Reply // repeats of a delivered msgid, not delivered again
	refused   []Refusal
}

// Refusal is a send_msg WeChat refused for the customer's session: its
// state (95013, 95018), the 48-hour window (95002) or the 5 messages
// after each of the customer's (95001).
type Refusal struct {
	Reply
	Errcode int
}

// Refusals returns the session refusals of send_msg, in order.
func (s *Server) Refusals() []Refusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Refusal(nil), s.kf().refused...)
}

func (s *Server) kf() *kfState {
	if s.kfs == nil {
		s.kfs = &kfState{sessions: map[string]*session{}, welcomes: map[string]*welcome{}, msgIDs: map[string]bool{},
			media: map[string]bool{}}
	}
	return s.kfs
}

func (s *Server) sessionOf(openKfID, user string) *session {
	k := s.kf()
	se := k.sessions[openKfID+"/"+user]
	if se == nil {
		se = &session{}
		k.sessions[openKfID+"/"+user] = se
	}
	return se
}

// noteIncoming updates the reply side for a message appended to
// openKfID's log (s.mu held): a customer's message opens the reply window
// again, an enter_session event gets a welcome_code.
func (s *Server) noteIncoming(openKfID string, obj map[string]json.RawMessage, sendTime int64) {
	if ev, ok := obj["event"]; ok {
		var e map[string]any
		if json.Unmarshal(ev, &e) != nil || e["event_type"] != "enter_session" {
			return
		}
		user, _ := e["external_userid"].(string)
		code, _ := e["welcome_code"].(string)
		if code == "" {
			code = randHex(16)
			e["welcome_code"] = code
			obj["event"], _ = json.Marshal(e)
		}
		s.kf().welcomes[code] = &welcome{openKfID: openKfID, user: user, expires: s.opts.Clock().Add(welcomeCodeTTL)}
		return
	}
	user := jsonString(obj["external_userid"])
	var origin int
	_ = json.Unmarshal(obj["origin"], &origin)
	if user == "" || (origin != 0 && origin != 3) {
		return // not a customer's message
	}
	se := s.sessionOf(openKfID, user)
	se.quota = replyQuota
	if s.opts.ReplyQuota > 0 {
		se.quota = s.opts.ReplyQuota
	}
	se.windowEnd = time.Unix(sendTime, 0).Add(replyWindow)
	if se.state == 4 {
		se.state, se.servicer = 0, "" // a new session
	}
}

// Replies returns the messages delivered to user of openKfID, in order
// (both empty: all).
func (s *Server) Replies(openKfID, user string) []Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Reply
	for _, r := range s.kf().replies {
		if (openKfID == "" || r.OpenKfID == openKfID) && (user == "" || r.User == user) {
			out = append(out, r)
		}
	}
	return out
}

// Transfers returns the accepted session state changes, in order.
func (s *Server) Transfers() []Transfer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Transfer(nil), s.kf().transfers...)
}

// DuplicateMsgIDs counts messages sent with a msgid already delivered for
// the same account (not delivered again).
func (s *Server) DuplicateMsgIDs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kf().dups)
}

// Duplicates returns the repeats DuplicateMsgIDs counts, each with the
// time it arrived, in order.
func (s *Server) Duplicates() []Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Reply(nil), s.kf().dups...)
}

// SessionState returns the state of user's session (as service_state/get).
func (s *Server) SessionState(openKfID, user string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionOf(openKfID, user).state
}

// authorize checks the access token (s.mu held); false when it answered.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) bool {
	tok := r.URL.Query().Get("access_token")
	exp, known := s.accessTokens[tok]
	switch {
	case tok == "":
		writeErr(w, 41001, "access_token missing")
	case !known:
		writeErr(w, 40014, "invalid access_token")
	case !s.opts.Clock().Before(exp):
		writeErr(w, 42001, "access_token expired")
	default:
		if len(s.failSend) > 0 {
			code := s.failSend[0]
			s.failSend = s.failSend[1:]
			writeErr(w, code, "injected")
			return false
		}
		return true
	}
	return false
}

// FailNextSend makes the next n calls of the reply-side APIs answer
// errcode (e.g. -1 or 45009).
func (s *Server) FailNextSend(n, errcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failSend = append(s.failSend, errcode)
	}
}

type sendBody struct {
	ToUser   string `json:"touser"`
	OpenKfID string `json:"open_kfid"`
	Code     string `json:"code"`
	MsgID    string `json:"msgid"`
	MsgType  string `json:"msgtype"`
}

var sendTypes = map[string]bool{"text": true, "image": true, "voice": true, "video": true, "file": true, "link": true,
	"miniprogram": true, "msgmenu": true, "location": true, "ca_link": true}

// maxText is WeChat's limit on a text message's content, in bytes (45002
// beyond it).
const maxText = 2048

func (s *Server) sendMsg(w http.ResponseWriter, r *http.Request, onEvent bool) {
	var raw map[string]json.RawMessage
	decErr := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&raw)
	var b sendBody
	if decErr == nil {
		buf, _ := json.Marshal(raw)
		decErr = json.Unmarshal(buf, &b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authorize(w, r) {
		return
	}
	if decErr != nil || !sendTypes[b.MsgType] || len(raw[b.MsgType]) == 0 || len(b.MsgID) > 32 {
		writeErr(w, 40058, "invalid parameter")
		return
	}
	var content struct {
		Content string `json:"content"`
		LinkURL string `json:"link_url"`
	}
	_ = json.Unmarshal(raw[b.MsgType], &content)
	switch {
	case b.MsgType == "text" && len(content.Content) > maxText:
		writeErr(w, 45002, "content size out of limit")
		return
	case b.MsgType == "ca_link" && !strings.HasPrefix(content.LinkURL, "https://"):
		writeErr(w, 40058, "invalid ca_link link_url")
		return
	}
	now := s.opts.Clock()
	if onEvent {
		wc := s.kf().welcomes[b.Code]
		switch {
		case b.MsgType != "text" && b.MsgType != "msgmenu":
			writeErr(w, 40058, "invalid msgtype for send_msg_on_event")
			return
		case wc == nil || wc.used || !now.Before(wc.expires):
			writeErr(w, 95017, "welcome_code expired or used")
			return
		}
		wc.used = true
		b.OpenKfID, b.ToUser = wc.openKfID, wc.user
	} else {
		se := s.kf().sessions[b.OpenKfID+"/"+b.ToUser]
		refuse := func(code int, msg string) {
			s.kf().refused = append(s.kf().refused, Refusal{Reply: Reply{OpenKfID: b.OpenKfID, User: b.ToUser, MsgID: b.MsgID,
				MsgType: b.MsgType, Body: raw[b.MsgType], At: now}, Errcode: code})
			writeErr(w, code, msg)
		}
		switch {
		case !s.accounts[b.OpenKfID]:
			writeErr(w, 95000, "invalid open_kfid")
			return
		case se == nil:
			writeErr(w, 40096, "invalid external_userid")
			return
		case se.state == 4:
			refuse(95013, "session ended")
			return
		case se.state == 3:
			refuse(95018, "session status invalid: a servicer holds the session")
			return
		case !now.Before(se.windowEnd):
			refuse(95002, "more than 48 hours since the customer's last message")
			return
		case se.quota <= 0:
			refuse(95001, "message limit reached; wait for the customer to reply")
			return
		}
	}
	if id := mediaIDOf(b.MsgType, raw[b.MsgType]); id != "" && !s.kf().media[id] {
		writeErr(w, 40007, "invalid media_id")
		return
	}
	if b.MsgID == "" {
		b.MsgID = randHex(16)
	}
	if k := b.OpenKfID + "/" + b.MsgID; s.kf().msgIDs[k] {
		s.kf().dups = append(s.kf().dups, Reply{OpenKfID: b.OpenKfID, User: b.ToUser, MsgID: b.MsgID, MsgType: b.MsgType,
			Body: raw[b.MsgType], OnEvent: onEvent, At: now})
		writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "msgid": b.MsgID})
		return
	} else {
		s.kf().msgIDs[k] = true
	}
	if !onEvent {
		s.kf().sessions[b.OpenKfID+"/"+b.ToUser].quota--
	}
	s.kf().replies = append(s.kf().replies, Reply{OpenKfID: b.OpenKfID, User: b.ToUser, MsgID: b.MsgID, MsgType: b.MsgType,
		Body: raw[b.MsgType], OnEvent: onEvent, At: now})
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "msgid": b.MsgID})
}

// transitions are the service_state/trans changes WeChat allows.
var transitions = map[int][]int{
	0: {1, 2, 3, 4},
	1: {2, 3, 4},
	2: {3, 4},
	3: {3, 4},
}

func (s *Server) serviceState(w http.ResponseWriter, r *http.Request, trans bool) {
	var b struct {
		OpenKfID string `json:"open_kfid"`
		User     string `json:"external_userid"`
		State    int    `json:"service_state"`
		Servicer string `json:"servicer_userid"`
	}
	decErr := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authorize(w, r) {
		return
	}
	switch {
	case decErr != nil:
		writeErr(w, 40058, "invalid parameter")
		return
	case !s.accounts[b.OpenKfID]:
		writeErr(w, 95000, "invalid open_kfid")
		return
	}
	se := s.sessionOf(b.OpenKfID, b.User)
	if !trans {
		writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "service_state": se.state, "servicer_userid": se.servicer})
		return
	}
	allowed := false
	for _, to := range transitions[se.state] {
		allowed = allowed || to == b.State
	}
	if !allowed || (b.State == 3 && b.Servicer == "") {
		writeErr(w, 95016, "service state transition not allowed")
		return
	}
	s.kf().transfers = append(s.kf().transfers, Transfer{OpenKfID: b.OpenKfID, User: b.User, From: se.state, To: b.State,
		Servicer: b.Servicer, At: s.opts.Clock()})
	se.state, se.servicer = b.State, b.Servicer
	code := ""
	if b.State == 2 || b.State == 3 || b.State == 4 {
		code = randHex(16)
		s.kf().welcomes[code] = &welcome{openKfID: b.OpenKfID, user: b.User, expires: s.opts.Clock().Add(welcomeCodeTTL)}
	}
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "msg_code": code})
}

// mediaIDOf returns the media_id a message object refers to ("" none).
func mediaIDOf(msgType string, obj json.RawMessage) string {
	var m struct {
		MediaID      string `json:"media_id"`
		ThumbMediaID string `json:"thumb_media_id"`
	}
	_ = json.Unmarshal(obj, &m)
	switch msgType {
	case "image", "voice", "video", "file":
		if m.MediaID == "" {
			return "-" // missing: never uploaded
		}
		return m.MediaID
	case "link", "miniprogram":
		return m.ThumbMediaID
	}
	return ""
}

// customers answers customer/batchget.
func (s *Server) customers(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Users []string `json:"external_userid_list"`
	}
	decErr := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authorize(w, r) {
		return
	}
	if decErr != nil || len(b.Users) == 0 || len(b.Users) > 100 {
		writeErr(w, 40058, "external_userid_list must hold 1 to 100 ids")
		return
	}
	known := map[string]bool{}
	for k := range s.kf().sessions {
		known[k[strings.IndexByte(k, '/')+1:]] = true
	}
	list, invalid := []map[string]any{}, []string{}
	for _, u := range b.Users {
		if !known[u] {
			invalid = append(invalid, u)
			continue
		}
		list = append(list, map[string]any{"external_userid": u, "nickname": "nick-" + u, "avatar": "", "gender": 0,
			"unionid": ""})
	}
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "customer_list": list, "invalid_external_userid": invalid})
}

// maxMedia is the size limit of an upload by type.
var maxMedia = map[string]int64{"image": 10 << 20, "voice": 2 << 20, "video": 10 << 20, "file": 20 << 20}

// uploadMedia answers media/upload.
func (s *Server) uploadMedia(w http.ResponseWriter, r *http.Request) {
	typ := r.URL.Query().Get("type")
	limit, okType := maxMedia[typ]
	var size int64 = -1
	if okType {
		if f, h, err := r.FormFile("media"); err == nil {
			size = h.Size
			_ = f.Close()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authorize(w, r) {
		return
	}
	switch {
	case !okType:
		writeErr(w, 40004, "invalid media type")
		return
	case size <= 0:
		writeErr(w, 41005, "media data missing")
		return
	case size > limit:
		writeErr(w, 40006, "invalid file size")
		return
	}
	id := "m-" + randHex(16)
	s.kf().media[id] = true
	writeJSON(w, map[string]any{"errcode": 0, "errmsg": "ok", "type": typ, "media_id": id,
		"created_at": strconv.FormatInt(s.opts.Clock().Unix(), 10)})
}

// ReplyQuota returns how many more messages the API may send user now
// (WeChat's 5 after each of the customer's messages) and when the 48-hour
// window since the customer's last message ends (zero before they wrote).
func (s *Server) ReplyQuota(openKfID, user string) (left int, windowEnd time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.sessionOf(openKfID, user)
	if !s.opts.Clock().Before(se.windowEnd) {
		return 0, se.windowEnd
	}
	return se.quota, se.windowEnd
}

// Session status change types (the change_type of session_status_change).
const (
	ChangeFromQueue = 1 // a servicer took the session from the queue
	ChangeTransfer  = 2 // the session was transferred to another servicer
	ChangeEnded     = 3 // a servicer ended the session
	ChangeReopened  = 4 // a servicer took an ended or transferred session again
)

// SetSessionState sets user's session state (and servicer) without an
// event, as the state a test starts from.
func (s *Server) SetSessionState(openKfID, user string, state int, servicer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.sessionOf(openKfID, user)
	se.state, se.servicer = state, servicer
}

// ServicerTakes makes servicer hold user's session (state 3), as a
// servicer does from the WeCom client, and appends the
// session_status_change event WeChat sends (change_type 1 from the queue
// or a new session, 2 from another servicer), with a msg_code. It returns
// the event's msgid.
func (s *Server) ServicerTakes(openKfID, user, servicer string) string {
	s.mu.Lock()
	se := s.sessionOf(openKfID, user)
	change, old := ChangeFromQueue, se.servicer
	if se.state == 3 {
		change = ChangeTransfer
	}
	s.kf().transfers = append(s.kf().transfers, Transfer{OpenKfID: openKfID, User: user, From: se.state, To: 3, Servicer: servicer,
		At: s.opts.Clock(), ByServicer: true})
	se.state, se.servicer = 3, servicer
	s.mu.Unlock()
	return s.sessionEvent(openKfID, user, change, old, servicer)
}

// ServicerEnds ends user's session as its servicer does (state 4) and
// appends the session_status_change event (change_type 3). It returns the
// event's msgid.
func (s *Server) ServicerEnds(openKfID, user string) string {
	s.mu.Lock()
	se := s.sessionOf(openKfID, user)
	old := se.servicer
	s.kf().transfers = append(s.kf().transfers, Transfer{OpenKfID: openKfID, User: user, From: se.state, To: 4, At: s.opts.Clock(),
		ByServicer: true})
	se.state, se.servicer = 4, ""
	s.mu.Unlock()
	return s.sessionEvent(openKfID, user, ChangeEnded, old, "")
}

func (s *Server) sessionEvent(openKfID, user string, change int, old, new string) string {
	code := randHex(16)
	s.mu.Lock()
	s.kf().welcomes[code] = &welcome{openKfID: openKfID, user: user, expires: s.opts.Clock().Add(welcomeCodeTTL)}
	s.mu.Unlock()
	raw, _ := json.Marshal(map[string]any{
		"origin": wecom.OriginEvent, "msgtype": "event",
		"event": map[string]any{"event_type": "session_status_change", "open_kfid": openKfID, "external_userid": user,
			"change_type": change, "old_servicer_userid": old, "new_servicer_userid": new, "msg_code": code},
	})
	return s.Append(openKfID, raw)[0]
}
