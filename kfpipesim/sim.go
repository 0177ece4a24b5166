// Package kfpipesim lets a developer chat with their own bot on a laptop.
// Run starts the whole pipeline in one process — a fake WeChat,
// kf-producer, the dead-letter consumer and a schedule-consumer running
// the bot exactly as kfpipe.RunConsumer would — on embedded Kafka
// (librdkafka's mock cluster) and Redis (miniredis), nothing to install,
// and serves a web page (http://127.0.0.1:8095/ by default) in which you
// type as the customer or as a servicer and see the bot's replies, the
// customer's session state and their dead letters live.
//
// A main that calls Main instead of kfpipe.RunConsumer runs the simulator
// with --simulate and the real consumer otherwise:
//
//	go run . --simulate                 # then open http://127.0.0.1:8095/
//	go run . --simulate=127.0.0.1:9000  # another address
//	go run . --config config.yaml       # production: kfpipe.RunConsumer
package kfpipesim

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/demo"
	"github.com/kfpipe/kfpipe/internal/dlq"
)

// DefaultAddr is where the page is served unless WithAddr says otherwise.
const DefaultAddr = "127.0.0.1:8095"

// Option configures Run.
type Option func(*options)

type options struct {
	addr, config, kafka, redis string
	out                        io.Writer
}

// WithAddr serves the page on addr (host:port; port 0 picks a free one)
// instead of DefaultAddr.
func WithAddr(addr string) Option { return func(o *options) { o.addr = addr } }

// WithConfig starts the pipeline's configuration from the daemons' YAML
// file at path (its handler, limiter and dedup settings…); "" (the
// default) uses config/development.yaml when found in the working
// directory or above it, else the built-in defaults. Addresses, topics
// and tokens are always the simulator's own.
func WithConfig(path string) Option { return func(o *options) { o.config = path } }

// WithServices runs on real Kafka and Redis (e.g. those of `make up`)
// instead of embedded ones; "" keeps that one embedded. Every name gets a
// per-run suffix, removed at the end.
func WithServices(kafkaBrokers, redisAddr string) Option {
	return func(o *options) { o.kafka, o.redis = kafkaBrokers, redisAddr }
}

// WithOutput sends the simulator's notices (the page's URL) to w instead
// of stderr.
func WithOutput(w io.Writer) Option { return func(o *options) { o.out = w } }

// Main is a bot's main in one call: with --simulate (or
// --simulate=ADDR) in args it runs the simulator with h (--config FILE
// still chooses the configuration it starts from), otherwise
// kfpipe.RunConsumer(ctx, args, h). args are the command-line arguments
// without the program name (os.Args[1:]).
//
// -h or --help prints the bot's usage (its name, --config and --simulate)
// to stderr and returns nil.
func Main(ctx context.Context, args []string, h kfpipe.Handler) error {
	if kfpipe.HelpAsked(args) {
		kfpipe.PrintUsage(os.Stderr, true)
		return nil
	}
	sim, opts, err := parseArgs(args)
	if err != nil {
		return err
	}
	if !sim {
		return kfpipe.RunConsumer(ctx, args, h)
	}
	return Run(ctx, h, opts...)
}

// parseArgs finds --simulate[=ADDR] and, with it, --config FILE; any
// other argument beside --simulate is an error.
func parseArgs(args []string) (bool, []Option, error) {
	var sim bool
	var opts []Option
	var unknown []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			name = ""
		}
		switch name {
		case "simulate":
			sim = true
			if hasVal {
				if val == "" {
					return false, nil, errors.New("--simulate=: the address is empty (host:port)")
				}
				opts = append(opts, WithAddr(val))
			}
		case "config":
			if !hasVal {
				if i+1 >= len(args) {
					return false, nil, errors.New("--config needs a file")
				}
				i++
				val = args[i]
			}
			opts = append(opts, WithConfig(val))
		default:
			unknown = append(unknown, a)
		}
	}
	if !sim {
		return false, nil, nil
	}
	if len(unknown) > 0 {
		return false, nil, fmt.Errorf("--simulate: unknown argument %q (only --config FILE goes with it)", unknown[0])
	}
	return true, opts, nil
}

// Run runs the simulator with h until ctx ends (or the consumer stops
// with an error), then shuts everything down.
func Run(ctx context.Context, h kfpipe.Handler, opts ...Option) error {
	o := options{addr: DefaultAddr, out: os.Stderr}
	for _, f := range opts {
		f(&o)
	}
	s, err := start(ctx, h, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "kfpipesim: chat with your bot at %s (kafka %s, redis %s; Ctrl-C to stop)\n", s.url, s.sb.Kafka, s.sb.Redis)
	select {
	case <-ctx.Done():
	case err = <-s.consumerDone:
		s.consumerDone <- err // close waits for it
		if err != nil {
			err = fmt.Errorf("kfpipesim: the consumer stopped: %w", err)
		}
	}
	return errors.Join(err, s.close())
}

// sim is a running simulator.
type sim struct {
	sb           *demo.Sandbox
	url          string
	srv          *http.Server
	cancel       context.CancelFunc
	consumerDone chan error

	mu   sync.Mutex
	sent map[string][]*line // user → what was typed, in order
	seen map[string]*line   // msgid → its line
}

// line is one message typed on the page.
type line struct {
	From     string    `json:"from"` // customer, servicer, event
	Text     string    `json:"text"`
	At       time.Time `json:"at"`
	MsgID    string    `json:"msgid"`
	Status   string    `json:"status"` // queued, handled, failed
	Error    string    `json:"error,omitempty"`
	Attempts int       `json:"attempts"`
}

func start(ctx context.Context, h kfpipe.Handler, o options) (*sim, error) {
	if h == nil {
		return nil, errors.New("kfpipesim: Run needs a handler")
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return nil, fmt.Errorf("kfpipesim: serve the page on %s: %w (WithAddr or --simulate=ADDR to change)", o.addr, err)
	}
	sb, err := demo.StartSandbox(ctx, demo.Options{ConfigPath: o.config, Kafka: o.kafka, Redis: o.redis, Notice: o.out})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("kfpipesim: %w", err)
	}
	s := &sim{sb: sb, url: "http://" + ln.Addr().String() + "/", consumerDone: make(chan error, 1),
		sent: map[string][]*line{}, seen: map[string]*line{}}
	c, err := kfpipe.NewConsumer(sb.Consumer, kfpipe.Chain(h, s.observe), historyOptions(sb.Consumer)...)
	if err != nil {
		ln.Close()
		return nil, errors.Join(fmt.Errorf("kfpipesim: %w", err), sb.Close())
	}
	cctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.consumerDone <- c.Run(cctx) }()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("POST /api/send", s.handleSend)
	mux.HandleFunc("POST /api/session", s.handleSession)
	mux.HandleFunc("GET /api/state", s.handleState)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// observe notes each handling of a typed message, for the page.
func (s *sim) observe(next kfpipe.Handler) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		err := next.Handle(ctx, m)
		s.mu.Lock()
		if l := s.seen[m.UpstreamMsgID]; l != nil {
			l.Attempts++
			l.Status, l.Error = "handled", ""
			if err != nil {
				l.Status, l.Error = "failed", err.Error()
			}
		}
		s.mu.Unlock()
		return err
	})
}

func (s *sim) close() error {
	s.cancel()
	err := <-s.consumerDone
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(err, s.srv.Shutdown(sctx), s.sb.Close())
}

// Sending as: the page's toggle.
const (
	asCustomer = "customer"
	asServicer = "servicer"
	asEnter    = "enter_session" // the customer opens the chat
)

// servicerID is the servicer the page types as.
const servicerID = "servicer-1"

type sendRequest struct {
	User string `json:"user"`
	As   string `json:"as"`
	Text string `json:"text"`
	// MenuID: the customer tapped this item of a menu (Text is its
	// content).
	MenuID string `json:"menu_id,omitempty"`
	// Type is what the customer sends: "text" (or ""), "image",
	// "voice", "video", "file" (Data, FileName, ContentType) or
	// "location" (Location).
	Type        string    `json:"type,omitempty"`
	Data        []byte    `json:"data,omitempty"` // base64 in JSON
	FileName    string    `json:"file_name,omitempty"`
	ContentType string    `json:"content_type,omitempty"`
	Location    *location `json:"location,omitempty"`
}

// location is a place the customer shares.
type location struct {
	Latitude  float64 `json:"latitude"`
	Longitude float64 `json:"longitude"`
	Name      string  `json:"name"`
	Address   string  `json:"address"`
}

// maxSendBytes bounds a send's body: WeChat's largest media (a 20 MB
// file) in base64, and the JSON around it.
const maxSendBytes = 28 << 20

// send appends a message to the fake WeChat's log and notifies
// kf-producer, as WeChat does when someone writes.
func (s *sim) send(ctx context.Context, r sendRequest) (string, error) {
	r.User = strings.TrimSpace(r.User)
	if r.User == "" {
		return "", errors.New("user: empty (the customer's external_userid)")
	}
	media := r.Type != "" && r.Type != "text"
	if media && r.As != asCustomer && r.As != "" {
		return "", fmt.Errorf("type %s: only the customer sends media or a location here", r.Type)
	}
	if r.As != asEnter && !media && strings.TrimSpace(r.Text) == "" {
		return "", errors.New("text: empty")
	}
	if r.MenuID != "" && r.As != asCustomer && r.As != "" {
		return "", errors.New("menu_id: only the customer taps a menu")
	}
	acc := s.sb.Account
	var id string
	switch r.As {
	case asCustomer, "":
		r.As = asCustomer
		if media {
			var err error
			if id, r.Text, err = s.sendMedia(acc, r); err != nil {
				return "", err
			}
			break
		}
		if r.MenuID != "" {
			id = s.sb.Fake.AddMenuClick(acc, r.User, r.MenuID, r.Text)
			r.Text = "[tap] " + r.Text
			break
		}
		id = s.sb.Fake.AddText(acc, r.User, r.Text)
	case asServicer:
		id = s.sb.Fake.AddServicerText(acc, r.User, servicerID, r.Text)
	case asEnter:
		id = s.sb.Fake.AddEvent(acc, r.User, asEnter)
		r.Text = "(opens the chat: enter_session)"
	default:
		return "", fmt.Errorf("as: %q, want %q, %q or %q", r.As, asCustomer, asServicer, asEnter)
	}
	from := r.As
	if from == asEnter {
		from = "event"
	}
	s.note(r.User, &line{From: from, Text: r.Text, At: s.sb.Fake.ReceivedAt(acc, id), MsgID: id, Status: "queued"})
	return id, s.notify(ctx)
}

// note adds l to user's conversation.
func (s *sim) note(user string, l *line) {
	s.mu.Lock()
	s.sent[user] = append(s.sent[user], l)
	s.seen[l.MsgID] = l
	s.mu.Unlock()
}

// sendMedia appends r's media or location to the fake WeChat's log (the
// media served by its media/get, as WeChat's, kept 3 days) and returns its
// msgid and the line the page shows.
func (s *sim) sendMedia(acc string, r sendRequest) (id, text string, err error) {
	switch r.Type {
	case "image", "voice", "video", "file":
		if len(r.Data) == 0 {
			return "", "", fmt.Errorf("data: empty (the %s's bytes)", r.Type)
		}
		ct := r.ContentType
		if ct == "" {
			ct = http.DetectContentType(r.Data)
		}
		id, _ = s.sb.Fake.AddMedia(acc, r.User, r.Type, r.FileName, ct, r.Data)
		name := r.FileName
		if name == "" {
			name = ct
		}
		return id, fmt.Sprintf("[%s] %s, %d KB", r.Type, name, (len(r.Data)+1023)/1024), nil
	case "location":
		if r.Location == nil {
			return "", "", errors.New("location: missing")
		}
		l := r.Location
		raw, _ := json.Marshal(map[string]any{"external_userid": r.User, "origin": 3, "msgtype": "location",
			"location": map[string]any{"latitude": l.Latitude, "longitude": l.Longitude, "name": l.Name, "address": l.Address}})
		id = s.sb.Fake.Append(acc, raw)[0]
		return id, fmt.Sprintf("[location] %s, %s (%.5f, %.5f)", l.Name, l.Address, l.Latitude, l.Longitude), nil
	}
	return "", "", fmt.Errorf("type: %q, want text, image, voice, video, file or location", r.Type)
}

// notify sends WeChat's callback, as WeChat does when someone writes.
func (s *sim) notify(ctx context.Context) error {
	if err := s.sb.Notify(ctx); err != nil {
		// kf-producer's periodic sync still pulls it.
		return fmt.Errorf("callback to kf-producer: %w (the message is in WeChat's log and will be pulled by the periodic sync)", err)
	}
	return nil
}

type sessionRequest struct {
	User string `json:"user"`
	// Action is "take" (the servicer takes the session, state 3) or
	// "end" (the servicer ends it, state 4).
	Action string `json:"action"`
}

// session changes the customer's session as the servicer does from the
// WeCom client: the fake WeChat changes the state and appends the
// session_status_change event the bot then receives.
func (s *sim) session(ctx context.Context, r sessionRequest) (string, error) {
	r.User = strings.TrimSpace(r.User)
	if r.User == "" {
		return "", errors.New("user: empty (the customer's external_userid)")
	}
	acc := s.sb.Account
	var id, text string
	switch r.Action {
	case "take":
		id = s.sb.Fake.ServicerTakes(acc, r.User, servicerID)
		text = "(" + servicerID + " takes the session: session_status_change)"
	case "end":
		id = s.sb.Fake.ServicerEnds(acc, r.User)
		text = "(" + servicerID + " ends the session: session_status_change)"
	default:
		return "", fmt.Errorf("action: %q, want take or end", r.Action)
	}
	s.note(r.User, &line{From: "event", Text: text, At: s.sb.Fake.ReceivedAt(acc, id), MsgID: id, Status: "queued"})
	return id, s.notify(ctx)
}

func (s *sim) handleSession(w http.ResponseWriter, r *http.Request) {
	serveAction(w, r, 1<<16, s.session)
}

func (s *sim) handleSend(w http.ResponseWriter, r *http.Request) {
	serveAction(w, r, maxSendBytes, s.send)
}

// serveAction decodes a JSON request of at most limit bytes, runs do and
// answers its msgid: 400 when nothing was done, 200 with a warning when
// it was done with one.
func serveAction[T any](w http.ResponseWriter, r *http.Request, limit int64, do func(context.Context, T) (string, error)) {
	var req T
	if err := json.NewDecoder(io.LimitReader(r.Body, limit)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
		return
	}
	id, err := do(r.Context(), req)
	if err != nil && id == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	resp := map[string]string{"msgid": id}
	if err != nil {
		resp["warning"] = err.Error()
	}
	writeJSON(w, http.StatusOK, resp)
}

// entry is one line of the conversation the page shows.
type entry struct {
	line
	Reply bool `json:"reply,omitempty"` // the bot's
	// Menu are the items a customer can tap in the bot's menu.
	Menu []menuItem `json:"menu,omitempty"`
}

// menuItem is a tappable item (a click) of a menu the bot sent.
type menuItem struct {
	ID      string `json:"id"`
	Content string `json:"content"`
}

// deadLetter is one of the user's dead letters.
type deadLetter struct {
	ID        string     `json:"id"`
	MsgID     string     `json:"msgid"`
	Reason    string     `json:"reason"`
	Error     string     `json:"error"`
	State     string     `json:"state"`
	Failures  int        `json:"failures"`
	Preview   string     `json:"preview,omitempty"`
	NextRetry *time.Time `json:"next_retry,omitempty"`
}

// state is what GET /api/state answers.
type state struct {
	User        string `json:"user"`
	Account     string `json:"account"`
	Session     int    `json:"session"`
	SessionName string `json:"session_name"`
	// RepliesLeft is how many more messages the bot may send the
	// customer (WeChat's 5 after each of their messages, within 48 hours
	// of the last: the fake's rule); WindowEnd when those 48 hours end.
	RepliesLeft int          `json:"replies_left"`
	WindowEnd   time.Time    `json:"window_end"`
	Messages    []entry      `json:"messages"`
	DeadLetters []deadLetter `json:"dead_letters"`
	DLQError    string       `json:"dlq_error,omitempty"`
	Kafka       string       `json:"kafka"` // "embedded" or the brokers
	Redis       string       `json:"redis"`
	AdminURL    string       `json:"admin_url"`
}

// sessionNames are WeChat's service states (service_state/get).
var sessionNames = []string{"0 untreated (new)", "1 with the bot", "2 queued for a servicer", "3 with a servicer", "4 ended"}

// snapshot is the conversation of user so far.
func (s *sim) snapshot(ctx context.Context, user string) state {
	acc := s.sb.Account
	st := state{User: user, Account: acc, Session: s.sb.Fake.SessionState(acc, user), Kafka: s.sb.Kafka,
		Redis: s.sb.Redis, AdminURL: s.sb.AdminURL + "/admin/ui/", Messages: []entry{}, DeadLetters: []deadLetter{}}
	st.RepliesLeft, st.WindowEnd = s.sb.Fake.ReplyQuota(acc, user)
	if st.Session >= 0 && st.Session < len(sessionNames) {
		st.SessionName = sessionNames[st.Session]
	}
	s.mu.Lock()
	for _, l := range s.sent[user] {
		st.Messages = append(st.Messages, entry{line: *l})
	}
	s.mu.Unlock()
	for _, r := range s.sb.Fake.Replies(acc, user) {
		kind := "reply"
		if r.OnEvent {
			kind = "welcome"
		}
		text, menu := render(r.MsgType, r.Body)
		st.Messages = append(st.Messages, entry{Reply: true, Menu: menu, line: line{From: "bot", Text: text,
			At: r.At, MsgID: r.MsgID, Status: kind}})
	}
	for _, t := range s.sb.Fake.Transfers() {
		// A servicer's own change is on the page as its event's line.
		if t.OpenKfID == acc && t.User == user && !t.ByServicer {
			st.Messages = append(st.Messages, entry{Reply: true, line: line{From: "bot", Status: "transfer",
				At: t.At, Text: fmt.Sprintf("(session %d → %d %s)", t.From, t.To, t.Servicer)}})
		}
	}
	// Every entry has the time WeChat took it (a message's arrival, a
	// reply's or a transfer's acceptance): the conversation in that order.
	sort.SliceStable(st.Messages, func(i, j int) bool { return st.Messages[i].At.Before(st.Messages[j].At) })
	es, _, err := s.sb.DLQ.List(ctx, dlq.Filter{User: user, Limit: 100})
	if err == nil {
		err = s.sb.DLQ.Whole(ctx, es) // the upstream msgid is in the letter
	}
	if err != nil {
		st.DLQError = err.Error()
	}
	for _, e := range es {
		st.DeadLetters = append(st.DeadLetters, deadLetter{ID: e.ID, MsgID: e.UpstreamMsgID, Reason: string(e.Reason),
			Error: e.Details, State: e.State, Failures: e.Failures, Preview: e.Preview, NextRetry: e.NextRetryTime})
	}
	return st
}

func (s *sim) handleState(w http.ResponseWriter, r *http.Request) {
	user := strings.TrimSpace(r.URL.Query().Get("user"))
	if user == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "user: empty (?user=…)"})
		return
	}
	writeJSON(w, http.StatusOK, s.snapshot(r.Context(), user))
}

// render shows a message the bot sent: a text's content, a menu's lines
// (and its tappable items), or its type.
func render(msgType string, body json.RawMessage) (string, []menuItem) {
	switch msgType {
	case "text":
		var t struct{ Content string }
		_ = json.Unmarshal(body, &t)
		return t.Content, nil
	case "msgmenu":
		var mm struct {
			HeadContent string                       `json:"head_content"`
			TailContent string                       `json:"tail_content"`
			List        []map[string]json.RawMessage `json:"list"`
		}
		_ = json.Unmarshal(body, &mm)
		parts := []string{mm.HeadContent}
		var taps []menuItem
		for _, it := range mm.List {
			var typ string
			_ = json.Unmarshal(it["type"], &typ)
			var item struct{ ID, Content string }
			_ = json.Unmarshal(it[typ], &item) // click, view or miniprogram
			parts = append(parts, "["+item.Content+"]")
			if typ == "click" {
				taps = append(taps, menuItem{ID: item.ID, Content: item.Content})
			}
		}
		return strings.TrimSpace(strings.Join(append(parts, mm.TailContent), "\n")), taps
	}
	return "(" + msgType + ")", nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

//go:embed page.html
var page []byte
