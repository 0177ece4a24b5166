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

	ln   net.Listener
	done chan error
}

// ServerConfig configures the ops server.
type ServerConfig struct {
	Addr         string
	Pprof        bool
	ReadyTimeout time.Duration
}

// NewServer builds the ops server; checks are added with AddCheck.
func NewServer(c ServerConfig, reg *prometheus.Registry, log *zap.Logger) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 2 * time.Second
	}
	s := &Server{mux: http.NewServeMux(), timeout: c.ReadyTimeout, log: log, checks: map[string]Check{},
		details: map[string]func() string{}}
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

// Ready runs every check concurrently and returns the failures by name.
func (s *Server) Ready(ctx context.Context) map[string]error {
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for k, v := range s.checks {
		checks[k] = v
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		fail = map[string]error{}
	)
	for name, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c(ctx); err != nil {
				mu.Lock()
				fail[name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return fail
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	fail := s.Ready(r.Context())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	var b strings.Builder
	if len(fail) == 0 {
		b.WriteString("ready\n")
	}
	for _, n := range slices.Sorted(maps.Keys(fail)) {
		fmt.Fprintf(&b, "%s: not ready: %v\n", n, fail[n])
	}
	details := s.Details()
	for _, n := range slices.Sorted(maps.Keys(details)) {
		fmt.Fprintf(&b, "%s: %s\n", n, details[n])
	}
	if len(fail) > 0 {
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
	return err
}
