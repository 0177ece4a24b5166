package obs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Server is the per-daemon ops HTTP server.
type Server struct {
	srv     *http.Server
	mux     *http.ServeMux
	timeout time.Duration
	log     *zap.Logger

	mu      sync.Mutex
	checks  map[string]Check
	details map[string]func() string

	// Readiness is cached: a refresher runs the checks every interval
	// and when /readyz asks; /readyz waits at most answerWithin for a
	// result begun after its request, then answers from the last one.
	interval, answerWithin time.Duration
	started                atomic.Bool
	kick                   chan struct{}
	last                   readiness     // under mu
	fresh                  chan struct{} // closed when last is replaced; under mu
	stopRefresh            context.CancelFunc
	refreshDone            chan struct{}

	ln   net.Listener
	done chan error
}

// readiness is one run of every check.
type readiness struct {
	begun time.Time // zero: no run has finished yet
	fail  map[string]error
}

// ServerConfig configures the ops server.
type ServerConfig struct {
	Addr  string
	Pprof bool
	// ReadyTimeout bounds one run of the checks (default 2 s); a check
	// that has not answered by then counts as failing.
	ReadyTimeout time.Duration
	// Starting makes /readyz answer 503 "starting" until Started is
	// called: a daemon sets it and calls Started once every check of its
	// own is registered and its listeners are up.
	Starting bool
	// ReadyInterval is how often the checks run in the background
	// (default 1 s); AnswerWithin bounds how long /readyz waits for a
	// fresh run before it answers from the last one (default 500 ms, at
	// most ReadyTimeout). A probe's timeout must exceed AnswerWithin.
	ReadyInterval time.Duration
	AnswerWithin  time.Duration
}

// DefaultAnswerWithin is how long /readyz waits at most for a fresh run
// of the checks unless ServerConfig.AnswerWithin says otherwise.
const DefaultAnswerWithin = 500 * time.Millisecond

// NewServer builds the ops server; checks are added with AddCheck.
func NewServer(c ServerConfig, reg *prometheus.Registry, log *zap.Logger) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 2 * time.Second
	}
	if c.ReadyInterval <= 0 {
		c.ReadyInterval = time.Second
	}
	if c.AnswerWithin <= 0 {
		c.AnswerWithin = DefaultAnswerWithin
	}
	c.AnswerWithin = min(c.AnswerWithin, c.ReadyTimeout)
	s := &Server{mux: http.NewServeMux(), timeout: c.ReadyTimeout, log: log, checks: map[string]Check{},
		details: map[string]func() string{}, interval: c.ReadyInterval, answerWithin: c.AnswerWithin,
		kick: make(chan struct{}, 1), fresh: make(chan struct{})}
	s.started.Store(!c.Starting)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	if c.Pprof {
		s.mux.HandleFunc("/debug/pprof/", pprof.Index)
		s.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		s.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		s.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		s.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s.srv = &http.Server{Addr: c.Addr, Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
	return s
}

// AddCheck registers a readiness check under a dependency name ("kafka",
// "redis"); /readyz names every failing one.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handle mounts an extra handler on the ops mux.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// AddDetail registers a line of /readyz detail under a name: d returns
// what an operator should know that does not make the daemon unready (e.g.
// "waiting on 12 claims held by others, oldest 7s"), or "" for nothing. It
// must be quick and not block.
func (s *Server) AddDetail(name string, d func() string) {
	s.mu.Lock()
	s.details[name] = d
	s.mu.Unlock()
}

// Details returns the non-empty detail lines by name.
func (s *Server) Details() map[string]string {
	s.mu.Lock()
	ds := make(map[string]func() string, len(s.details))
	for k, v := range s.details {
		ds[k] = v
	}
	s.mu.Unlock()
	out := map[string]string{}
	for name, d := range ds {
		if v := d(); v != "" {
			out[name] = v
		}
	}
	return out
}

// Started ends the "starting" state of ServerConfig.Starting: from now
// on /readyz answers from the checks.
func (s *Server) Started() { s.started.Store(true) }

// Ready runs every check concurrently and returns the failures by name. It
// returns within the ready timeout: a check still running by then counts
// as failing.
func (s *Server) Ready(ctx context.Context) map[string]error {
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for k, v := range s.checks {
		checks[k] = v
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(checks))
	for name, c := range checks {
		go func() { results <- result{name, c(ctx)} }()
	}
	fail := map[string]error{}
	for range len(checks) {
		select {
		case r := <-results:
			if r.err != nil {
				fail[r.name] = r.err
			}
			delete(checks, r.name)
		case <-ctx.Done():
			for name := range checks {
				fail[name] = fmt.Errorf("no answer within %s", s.timeout)
			}
			return fail
		}
	}
	return fail
}

// refresh runs the checks every interval and when kicked, until ctx ends.
func (s *Server) refresh(ctx context.Context) {
	defer close(s.refreshDone)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		begun := time.Now()
		fail := s.Ready(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.last = readiness{begun: begun, fail: fail}
		close(s.fresh)
		s.fresh = make(chan struct{})
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// current returns a run of the checks begun after now if one finishes
// within answerWithin, else the last finished run (zero before the first).
func (s *Server) current(ctx context.Context) readiness {
	asked := time.Now()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	timer := time.NewTimer(s.answerWithin)
	defer timer.Stop()
	for {
		s.mu.Lock()
		last, fresh := s.last, s.fresh
		s.mu.Unlock()
		if !last.begun.IsZero() && !last.begun.Before(asked) {
			return last
		}
		select {
		case <-fresh:
		case <-timer.C:
			return last
		case <-ctx.Done():
			return last
		}
	}
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	var b strings.Builder
	var fail map[string]error
	switch {
	case !s.started.Load():
		b.WriteString("starting: not every readiness check is registered yet\n")
	case s.refreshDone == nil:
		// Not started with Start (a test's handler): run the checks.
		fail = s.Ready(r.Context())
	default:
		res := s.current(r.Context())
		fail = res.fail
		if res.begun.IsZero() {
			fmt.Fprintf(&b, "starting: the checks have not answered yet (each has up to %s)\n", s.timeout)
		}
	}
	ready := b.Len() == 0 && len(fail) == 0
	if ready {
		b.WriteString("ready\n")
	}
	for _, n := range slices.Sorted(maps.Keys(fail)) {
		fmt.Fprintf(&b, "%s: not ready: %v\n", n, fail[n])
	}
	details := s.Details()
	for _, n := range slices.Sorted(maps.Keys(details)) {
		fmt.Fprintf(&b, "%s: %s\n", n, details[n])
	}
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(b.String()))
}

// Start listens and serves in a goroutine owned by the server; Shutdown
// stops it and waits.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.srv.Addr)
	if err != nil {
		return fmt.Errorf("ops server listen %s: %w", s.srv.Addr, err)
	}
	s.ln = ln
	s.done = make(chan error, 1)
	rctx, stop := context.WithCancel(context.Background())
	s.stopRefresh, s.refreshDone = stop, make(chan struct{})
	go s.refresh(rctx)
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	s.log.Info("ops server listening", zap.String("addr", ln.Addr().String()))
	return nil
}

// Addr returns the bound address (useful with port 0).
func (s *Server) Addr() string {
	if s.ln == nil {
		return s.srv.Addr
	}
	return s.ln.Addr().String()
}

// Shutdown stops accepting, waits for in-flight requests until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.done == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; err == nil {
		err = serr
	}
	s.stopRefresh()
	<-s.refreshDone
	return err
}
