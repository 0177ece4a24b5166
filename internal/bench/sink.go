package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Ledger records what a load generator sent and what reached the end of
// the pipeline (the consumer's effects, and the dead letters), and checks
// the pipeline's properties: no loss, no duplicate effect, per-user order.
// Messages are identified by their upstream msgid; seq is the message's
// position in its user's stream.
type Ledger struct {
	mu       sync.Mutex
	sent     map[string]sentMsg // msgid → what was sent
	effects  map[string]int     // msgid → times handled
	dead     map[string]string  // msgid → DLQ reason
	order    map[string][]int   // user → seqs in the order handled
	unknown  int
	lat      Latencies
	lastSeen time.Time
}

type sentMsg struct {
	user string
	seq  int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{sent: map[string]sentMsg{}, effects: map[string]int{}, dead: map[string]string{},
		order: map[string][]int{}}
}

// Sent records that msgid was sent as user's seq-th message.
func (l *Ledger) Sent(msgid, user string, seq int) {
	l.mu.Lock()
	l.sent[msgid] = sentMsg{user: user, seq: seq}
	l.mu.Unlock()
}

// Handled records one effect of m.
func (l *Ledger) Handled(m *chatmsg.ChatMessage, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastSeen = now
	s, ok := l.sent[m.UpstreamMsgID]
	if !ok {
		l.unknown++
		return
	}
	l.effects[m.UpstreamMsgID]++
	l.order[s.user] = append(l.order[s.user], s.seq)
	if m.ProducedAt > 0 {
		l.lat.Add(float64(now.UnixMicro()-m.ProducedAt*1000) / 1000)
	}
}

// DeadLettered records that msgid went to the DLQ with reason.
func (l *Ledger) DeadLettered(msgid, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.sent[msgid]; ok {
		l.dead[msgid] = reason
	}
}

// Accounted is how many sent messages were handled or dead-lettered.
func (l *Ledger) Accounted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.sent {
		if l.effects[id] > 0 || l.dead[id] != "" {
			n++
		}
	}
	return n
}

// Report is the verdict of a Ledger.
type Report struct {
	Sent         int            `json:"sent"`
	Handled      int            `json:"handled"`
	DeadLettered map[string]int `json:"dead_lettered"`
	Recovered    int            `json:"recovered"` // dead-lettered, then handled
	Lost         int            `json:"lost"`
	Duplicates   int            `json:"duplicate_effects"`
	OutOfOrder   int            `json:"out_of_order_users"`
	Unknown      int            `json:"unknown_messages"`
	P50Ms        float64        `json:"p50_ms"`
	P99Ms        float64        `json:"p99_ms"`
	Examples     []string       `json:"examples,omitempty"`
}

// OK reports whether nothing was lost, duplicated or reordered.
func (r Report) OK() bool { return r.Lost == 0 && r.Duplicates == 0 && r.OutOfOrder == 0 }

// Verify checks the ledger. A message counts as lost when it was neither
// handled nor dead-lettered. Per-user order is checked over the handled
// messages only: a dead-lettered message leaves its user's order with a
// recorded reason (I4), so the handled sequence must be increasing.
func (l *Ledger) Verify() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Sent: len(l.sent), DeadLettered: map[string]int{}, Unknown: l.unknown}
	var ex []string
	for id := range l.sent {
		n := l.effects[id]
		switch {
		case n > 0:
			r.Handled++
			if n > 1 {
				r.Duplicates++
				ex = append(ex, fmt.Sprintf("duplicate: %s handled %d times", id, n))
			}
			if reason := l.dead[id]; reason != "" {
				// Dead-lettered, then retried and handled: recovered (the
				// handler ran once), as kf-loadgen check counts it.
				r.Recovered++
				r.DeadLettered[reason]++
			}
		case l.dead[id] != "":
			r.DeadLettered[l.dead[id]]++
		default:
			r.Lost++
			ex = append(ex, "lost: "+id)
		}
	}
	for user, seqs := range l.order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				r.OutOfOrder++
				ex = append(ex, fmt.Sprintf("order: user %s handled seq %d after %d", user, seqs[i], seqs[i-1]))
				break
			}
		}
	}
	sort.Strings(ex)
	if len(ex) > 10 {
		ex = ex[:10]
	}
	r.Examples = ex
	r.P50Ms, r.P99Ms = round(l.lat.Quantile(0.5), 2), round(l.lat.Quantile(0.99), 2)
	return r
}

// SinkHandler is the HTTP endpoint the consumer's http handler posts to
// (handler.type=http, handler.http.url): each POST body is one ChatMessage.
// It answers every message at once; NewSink adds delays, failures and a
// record.
func (l *Ledger) SinkHandler() http.Handler { return NewSink(l, SinkOptions{}).sinkHandler() }

// deadLetter is the part of a DLQ record the ledger needs.
type deadLetter struct {
	Reason        string               `json:"failure_reason"`
	UpstreamMsgID string               `json:"upstream_msgid"`
	Original      *chatmsg.ChatMessage `json:"original_message"`
}

// AddDeadLetter records a DLQ record's value.
func (l *Ledger) AddDeadLetter(value []byte) error {
	var dl deadLetter
	if err := json.Unmarshal(value, &dl); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	id := dl.UpstreamMsgID
	if id == "" && dl.Original != nil {
		id = dl.Original.UpstreamMsgID
	}
	if id == "" {
		return fmt.Errorf("dead letter without upstream msgid (reason %s)", dl.Reason)
	}
	l.DeadLettered(id, strings.TrimSpace(dl.Reason))
	return nil
}

// SinkOptions are a Sink's delay and failure modes: what an operator's
// downstream does on a bad day.
type SinkOptions struct {
	// Delay is how long each message is held before it is answered (the
	// handler's work); Jitter adds a random extra of up to Jitter.
	Delay, Jitter time.Duration
	// FailUsers are answered 500 (a downstream broken for those users:
	// the consumer retries, then dead-letters as downstream_error).
	FailUsers []string
	// FailWindows answer 503 to everyone inside each window, measured from
	// the Sink's start (the whole downstream is down).
	FailWindows []Window
	// Record, when set, gets one RecordLine per effect, in arrival order:
	// what kf-loadgen check reads.
	Record io.Writer
}

// Window is a time span relative to a start: from After, for For.
type Window struct{ After, For time.Duration }

// ParseWindow reads "FOR@AFTER" (e.g. "30s@10s": 30 s long, 10 s after
// the start).
func ParseWindow(s string) (Window, error) {
	f, a, ok := strings.Cut(s, "@")
	if !ok {
		return Window{}, fmt.Errorf("window %q: want DURATION@START, e.g. 30s@10s", s)
	}
	var w Window
	var err error
	if w.For, err = time.ParseDuration(f); err != nil || w.For <= 0 {
		return Window{}, fmt.Errorf("window %q: length %q must be a positive duration", s, f)
	}
	if w.After, err = time.ParseDuration(a); err != nil || w.After < 0 {
		return Window{}, fmt.Errorf("window %q: start %q must be a duration >= 0", s, a)
	}
	return w, nil
}

// RecordLine is one effect in a Sink's record: the format kf-loadgen check
// reads (one JSON object per line). A receiver of one's own can write the
// same lines; check also accepts upstream_msgid and external_userid for
// msgid and user, so a logged message body plus "at" will do.
type RecordLine struct {
	MsgID    string    `json:"msgid"`
	User     string    `json:"user"`
	OpenKfID string    `json:"open_kfid,omitempty"`
	At       time.Time `json:"at"`
}

// Sink is the HTTP receiver kf-loadgen runs for the consumer's http
// handler: it records effects in a Ledger (and a record file), after an
// optional delay, and fails on command. Routes:
//
//	POST /sink                      one ChatMessage: 204, or 500/503 when failing
//	POST /fail?user=U&on=true|false make U's messages fail (500) or not
//	POST /fail?all=true&on=...      answer 503 to everyone, or stop
//	GET  /fail                      the failure state and counts (JSON)
type Sink struct {
	l     *Ledger
	o     SinkOptions
	start time.Time

	mu        sync.Mutex
	failUsers map[string]bool
	down      bool           // switched on at /fail?all=true
	fails500  map[string]int // user → 500 answers
	fails503  int
	handled   int
	rec       *bufio.Writer
	recErr    error
	stop      chan struct{}
	done      chan struct{}
}

// NewSink returns a Sink recording into l (nil: record only); its windows
// count from now. Close flushes the record.
func NewSink(l *Ledger, o SinkOptions) *Sink {
	s := &Sink{l: l, o: o, start: time.Now(), failUsers: map[string]bool{}, fails500: map[string]int{},
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, u := range o.FailUsers {
		s.failUsers[u] = true
	}
	if o.Record == nil {
		close(s.done)
		return s
	}
	s.rec = bufio.NewWriter(o.Record)
	// The record is read while the Sink runs (a smoke test checks a
	// receiver that keeps serving): flush it often, not per message.
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.mu.Lock()
				s.flushLocked()
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *Sink) flushLocked() {
	if s.rec != nil && s.recErr == nil {
		s.recErr = s.rec.Flush()
	}
}

// Close stops the flusher and flushes the record; it returns the first
// error writing it.
func (s *Sink) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return s.recErr
}

// Handler serves /sink and /fail.
func (s *Sink) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/sink", s.sinkHandler())
	mux.HandleFunc("/fail", s.serveFail)
	return mux
}

// SetUser makes user's messages fail (500) or not.
func (s *Sink) SetUser(user string, fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fail {
		s.failUsers[user] = true
	} else {
		delete(s.failUsers, user)
	}
}

// SetDown makes the Sink answer 503 to everyone (on) or serve again. The
// FailWindows apply besides.
func (s *Sink) SetDown(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = on
}

// SinkState is what GET /fail answers.
type SinkState struct {
	FailingUsers []string       `json:"failing_users"`
	Down         bool           `json:"down"`
	Answers500   map[string]int `json:"answers_500"`
	Answers503   int            `json:"answers_503"`
	Handled      int            `json:"handled"`
}

// State returns the failure state and counts.
func (s *Sink) State() SinkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := SinkState{FailingUsers: []string{}, Down: s.down || s.inWindow(time.Now()), Answers500: map[string]int{},
		Answers503: s.fails503, Handled: s.handled}
	for u := range s.failUsers {
		st.FailingUsers = append(st.FailingUsers, u)
	}
	sort.Strings(st.FailingUsers)
	for u, n := range s.fails500 {
		st.Answers500[u] = n
	}
	return st
}

func (s *Sink) inWindow(now time.Time) bool {
	el := now.Sub(s.start)
	for _, w := range s.o.FailWindows {
		if el >= w.After && el < w.After+w.For {
			return true
		}
	}
	return false
}

func (s *Sink) serveFail(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		q := r.URL.Query()
		on, err := strconv.ParseBool(q.Get("on"))
		if err != nil {
			http.Error(w, "on must be true or false", http.StatusBadRequest)
			return
		}
		user, all := q.Get("user"), q.Get("all") == "true"
		switch {
		case user != "" && !all:
			for _, u := range strings.Split(user, ",") {
				s.SetUser(strings.TrimSpace(u), on)
			}
		case user == "" && all:
			s.SetDown(on)
		default:
			http.Error(w, "give user=U[,U2…] or all=true", http.StatusBadRequest)
			return
		}
	default:
		http.Error(w, "GET or POST", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.State())
}

func (s *Sink) sinkHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m, err := chatmsg.Decode(body)
		if err != nil {
			// 400: the consumer dead-letters it as handler_rejected.
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		if s.down || s.inWindow(time.Now()) {
			s.fails503++
			s.mu.Unlock()
			http.Error(w, "sink: downstream unavailable", http.StatusServiceUnavailable)
			return
		}
		if s.failUsers[m.ExternalUserID] {
			s.fails500[m.ExternalUserID]++
			s.mu.Unlock()
			http.Error(w, "sink: downstream failure for this user", http.StatusInternalServerError)
			return
		}
		s.mu.Unlock()
		if d := s.o.Delay + jitter(s.o.Jitter); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return // the consumer gave up: no effect
			}
		}
		now := time.Now()
		s.mu.Lock()
		s.handled++
		if s.rec != nil && s.recErr == nil {
			line, _ := json.Marshal(RecordLine{MsgID: m.UpstreamMsgID, User: m.ExternalUserID, OpenKfID: m.OpenKfID, At: now})
			_, s.recErr = s.rec.Write(append(line, '\n'))
		}
		s.mu.Unlock()
		if s.l != nil {
			s.l.Handled(m, now)
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func jitter(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return rand.N(max + 1)
}

// DeadLetters returns the reason of every sent message's dead letter
// (msgid → reason; the last one read when there were several).
func (l *Ledger) DeadLetters() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.dead))
	for id, r := range l.dead {
		out[id] = r
	}
	return out
}
