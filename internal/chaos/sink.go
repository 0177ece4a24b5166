package chaos

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Delivery is one handler call that reached the Sink: one effect.
type Delivery struct {
	Seq      int // order of arrival at the Sink
	MsgID    string
	OpenKfID string
	User     string
	Tag      string // consumer incarnation that posted it
	At       time.Time
	// Late: the caller had given up on the request (its timeout) when
	// the effect was made.
	Late bool
	// Arrived: when the request reached the Sink (the effect is At).
	Arrived time.Time
}

// Receiver, when set with SetReceiver, stands between a request the Sink
// decoded and its effect: it may hold the request (a slow receiver's
// queue and work) and answer a status instead of the effect (non-zero:
// no effect).
type Receiver func(r *http.Request, msgID string) (status int)

// SetReceiver puts f in front of every effect (nil: none).
func (s *Sink) SetReceiver(f Receiver) {
	if f == nil {
		s.receiver.Store(nil)
		return
	}
	s.receiver.Store(&f)
}

// Sink is the business side of the consumers' http handler: it records
// every delivery, after an optional random delay that stands for the
// handler's work. It answers 200 to everything it can decode; with
// replies on, the answer asks kfpipe to reply ReplyText(msgid) to the
// customer (docs/handler-protocol.md).
type Sink struct {
	srv      *httptest.Server
	sleepMax time.Duration
	replies  atomic.Bool
	receiver atomic.Pointer[Receiver]

	mu         sync.Mutex
	deliveries []Delivery
	seen       map[string]int // msgid → deliveries
	changed    time.Time
	failUsers  map[string]bool
	failRatio  float64        // FailRatio
	failures   map[string]int // user → 500 answers
	down       bool           // the whole downstream answers 503
	downCalls  int            // 503 answers given while down
	fence      bool           // Fence: refuse tokens older than a user's newest
	tokens     map[string]int64
	fenced     int // requests refused for an old token
	// delay, when set, is an extra handling time per message of a user
	// (Delay).
	delay atomic.Pointer[func(user string) time.Duration]
	slow  slowBot
}

// slowBot is SlowBot's setting and what it saw.
type slowBot struct {
	lo, hi    time.Duration
	firstFail float64
	attempts  map[string]int // msgid → requests
	abandoned int            // requests whose caller hung up before the answer
	calls     []BotCall
}

// BotCall is one request a SlowBot saw: when it arrived and ended, and how.
type BotCall struct {
	MsgID, User    string
	Arrived, Ended time.Time
	Outcome        BotOutcome
}

// BotOutcome is how a SlowBot request ended.
type BotOutcome int

const (
	// Answered: the bot made its effect (a Delivery).
	Answered BotOutcome = iota
	// FailedFast: the bot failed the first attempt at once (500).
	FailedFast
	// Abandoned: the caller hung up first (a cancelled attempt).
	Abandoned
)

// NewSink starts a Sink on a loopback port; Close stops it.
func NewSink(sleepMax time.Duration) *Sink {
	s := &Sink{sleepMax: sleepMax, seen: map[string]int{}, failUsers: map[string]bool{}, failures: map[string]int{},
		tokens: map[string]int64{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the handler URL for one consumer incarnation.
func (s *Sink) URL(tag string) string { return s.srv.URL + "/deliver/" + tag }

// Close stops the server.
func (s *Sink) Close() { s.srv.Close() }

// wireMsg is the part of the consumer's JSON body the Sink reads.
type wireMsg struct {
	UpstreamMsgID  string `json:"upstream_msgid"`
	OpenKfID       string `json:"open_kfid"`
	ExternalUserID string `json:"external_userid"`
}

func (s *Sink) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	tag, ok := strings.CutPrefix(r.URL.Path, "/deliver/")
	if !ok || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var m wireMsg
	if err == nil {
		err = json.Unmarshal(body, &m)
	}
	if err != nil || m.UpstreamMsgID == "" {
		// 400 makes the consumer dead-letter it as handler_rejected: such
		// a message is visible in the DLQ, not silently accepted.
		http.Error(w, "sink: undecodable message", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if s.down {
		s.downCalls++
		s.mu.Unlock()
		http.Error(w, "sink: downstream unavailable", http.StatusServiceUnavailable)
		return
	}
	firstFail := false
	if s.slow.firstFail > 0 {
		s.slow.attempts[m.UpstreamMsgID]++
		firstFail = s.slow.attempts[m.UpstreamMsgID] == 1 && rand.Float64() < s.slow.firstFail
	}
	if firstFail || s.failUsers[m.ExternalUserID] || (s.failRatio > 0 && rand.Float64() < s.failRatio) {
		// A broken downstream for this user: the consumer retries and then
		// dead-letters it as downstream_error. Not an effect.
		s.failures[m.ExternalUserID]++
		if firstFail {
			s.slow.calls = append(s.slow.calls, BotCall{MsgID: m.UpstreamMsgID, User: m.ExternalUserID,
				Arrived: arrived, Ended: time.Now(), Outcome: FailedFast})
		}
		s.mu.Unlock()
		http.Error(w, "sink: downstream failure for this user", http.StatusInternalServerError)
		return
	}
	slow := s.slow
	s.mu.Unlock()
	if f := s.receiver.Load(); f != nil {
		if code := (*f)(r, m.UpstreamMsgID); code != 0 {
			http.Error(w, "sink: receiver answered "+strconv.Itoa(code), code)
			return
		}
	}
	if s.sleepMax > 0 {
		time.Sleep(rand.N(s.sleepMax + 1))
	}
	if f := s.delay.Load(); f != nil {
		if d := (*f)(m.ExternalUserID); d > 0 {
			time.Sleep(d)
		}
	}
	if slow.hi > 0 {
		// A slow bot stops when its caller hangs up (the consumer
		// cancelled the attempt): no effect, no reply.
		select {
		case <-time.After(slow.lo + rand.N(slow.hi-slow.lo+1)):
		case <-r.Context().Done():
			s.mu.Lock()
			s.slow.abandoned++
			s.slow.calls = append(s.slow.calls, BotCall{MsgID: m.UpstreamMsgID, User: m.ExternalUserID,
				Arrived: arrived, Ended: time.Now(), Outcome: Abandoned})
			s.mu.Unlock()
			return
		}
	}
	token, _ := strconv.ParseInt(r.Header.Get("Kfpipe-Fencing-Token"), 10, 64)
	now := time.Now()
	s.mu.Lock()
	if s.fence {
		// A downstream that keeps the newest fencing token per user (a
		// user's messages share a partition, whose tokens only grow)
		// refuses an owner that lost the partition once its successor
		// was heard from. 409 is a failure, not an effect: the old owner
		// records no mark for it.
		if token < s.tokens[m.ExternalUserID] {
			s.fenced++
			s.mu.Unlock()
			http.Error(w, "sink: fencing token older than the user's newest", http.StatusConflict)
			return
		}
		s.tokens[m.ExternalUserID] = token
	}
	s.deliveries = append(s.deliveries, Delivery{Seq: len(s.deliveries), MsgID: m.UpstreamMsgID, OpenKfID: m.OpenKfID,
		User: m.ExternalUserID, Tag: tag, At: now, Late: r.Context().Err() != nil, Arrived: arrived})
	if slow.hi > 0 {
		s.slow.calls = append(s.slow.calls, BotCall{MsgID: m.UpstreamMsgID, User: m.ExternalUserID,
			Arrived: arrived, Ended: now, Outcome: Answered})
	}
	s.seen[m.UpstreamMsgID]++
	s.changed = now
	s.mu.Unlock()
	if !s.replies.Load() {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	answer, _ := json.Marshal(map[string]any{"replies": []any{
		map[string]any{"msgtype": "text", "text": map[string]any{"content": ReplyText(m.UpstreamMsgID)}}}})
	_, _ = w.Write(answer)
}

// Fence makes the Sink check each request's Kfpipe-Fencing-Token against
// the newest it accepted for the user and refuse (409) an older one.
func (s *Sink) Fence(on bool) {
	s.mu.Lock()
	s.fence = on
	s.mu.Unlock()
}

// Fenced counts the requests refused for an old token.
func (s *Sink) Fenced() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced
}

// SlowBot makes the Sink a slow bot's downstream: each delivery takes a
// random [lo, hi] and is abandoned, with no effect, when the consumer
// hangs up first; the first attempt of a fraction firstFail of the
// messages fails fast (500).
func (s *Sink) SlowBot(lo, hi time.Duration, firstFail float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow = slowBot{lo: lo, hi: max(hi, lo, time.Millisecond), firstFail: firstFail, attempts: map[string]int{}}
}

// Abandoned returns the SlowBot deliveries whose caller hung up first.
func (s *Sink) Abandoned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slow.abandoned
}

// BotCalls returns every request a SlowBot saw, in the order they ended.
func (s *Sink) BotCalls() []BotCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]BotCall(nil), s.slow.calls...)
}

// ReplyText is the reply the Sink asks for to the message msgid.
func ReplyText(msgid string) string { return "re:" + msgid }

// Reply makes the Sink's answers carry a reply to each message (on) or
// not.
func (s *Sink) Reply(on bool) { s.replies.Store(on) }

// FailUser makes the Sink answer 500 to every message of user from now
// on: the downstream is broken for that one user (a handler that keeps
// failing or panicking for it takes the same retry → DLQ path).
func (s *Sink) FailUser(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failUsers[user] = true
}

// FailRatio makes the Sink answer 500 to a random fraction r of the
// messages (each attempt drawn anew): a flaky downstream, which in-place
// retries mostly absorb.
func (s *Sink) FailRatio(r float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failRatio = r
}

// UnfailUser undoes FailUser: user's downstream works again.
func (s *Sink) UnfailUser(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failUsers, user)
}

// Down makes the Sink answer 503 to every message (on) or serve again:
// the downstream is down for everyone. It returns the 503 answers given
// so far.
func (s *Sink) Down(on bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = on
	return s.downCalls
}

// Failures returns the number of 500 answers given to user.
func (s *Sink) Failures(user string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures[user]
}

// Deliveries returns a copy of every delivery so far, in arrival order.
func (s *Sink) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Delivery(nil), s.deliveries...)
}

// Has reports whether msgid was delivered at least once.
func (s *Sink) Has(msgid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[msgid] > 0
}

// Len returns the number of deliveries and the time of the last one.
func (s *Sink) Len() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.deliveries), s.changed
}

// Delay makes the Sink take f(user) longer for each message of user (nil
// removes it): a receiver whose handling time changes during the run,
// per customer (the nemesis's slow handlers and slow receiver).
func (s *Sink) Delay(f func(user string) time.Duration) {
	if f == nil {
		s.delay.Store(nil)
		return
	}
	s.delay.Store(&f)
}
