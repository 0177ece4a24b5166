// Package console is the dlq-consumer's authenticated admin HTTP API and its
// small web console for dead letters and rate limiting (invariants I7, I8;
// docs/operations.md "The admin API and console").
//
// Every API request carries `Authorization: Bearer <token>`; a token has the
// role viewer (GET only) or operator (everything). Every write names a
// reason and is audited: one entry in the Redis stream <prefix>audit and one
// log line, whatever its result. Client mistakes get a JSON error with the
// offending field and a 4xx status, never a 5xx. The console under /admin/ui/
// is static (embedded) and holds no data: it calls the API with the token
// the operator typed in.
package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/fleet"
)

// Roles a token may have.
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
)

// Clock gives the audit entries their time.
type Clock = clock.Clock

// Config configures the admin API. Tokens, MaxBodyBytes and BatchRate
// come from config.Admin, which checked them when it loaded; Prefix is the
// Redis key prefix (the audit stream is Prefix+"audit").
type Config struct {
	Tokens       []config.AdminToken
	MaxBodyBytes int
	Prefix       string
	// Groups, when set, are the rate-limit groups PUT .../group accepts;
	// otherwise the RateLimitAdmin decides (ErrUnknownGroup).
	Groups []string
	// Reasons, when set, are the failure reasons the DLQ filters accept.
	Reasons []string
	// AuditMaxLen caps the audit stream (approximate trim); 0 means 100000.
	AuditMaxLen int64
	// Clock stamps audit entries; nil means the system clock.
	Clock Clock
	// BatchRate is how many letters a second a batch retry or purge acts
	// on (admin.batch_rate); 0 means 200.
	BatchRate int
	// Pipeline, when set, gives GET /admin/overview the accounts' sync
	// horizon and the schedule-consumers' lag; without it the overview
	// has the DLQ and the rate limiter only.
	Pipeline Pipeline
	// SampleHistory starts the verdict's history sampler (one sample a
	// minute into Redis); FromConfig sets it. Without it the history holds
	// what other replicas sampled.
	SampleHistory bool
	// RetryPace, when set, is the DLQ scheduler's pacing of one user's
	// retries (dlq.RetryPace for the default group): a batch retry's time
	// is the slowest user's paced time when that is longer than the
	// batch's own rate. Nil: retries are not paced.
	RetryPace func() (allow int, window time.Duration, paced bool)
	// Fleet, when set, is the running daemons GET /admin/fleet lists
	// (coord.enabled); without it that endpoint answers 503.
	Fleet FleetView
}

// FleetView is the fleet of running daemons (fleet.View).
type FleetView interface {
	// Members returns the daemons and when the list last changed.
	Members() ([]fleet.Member, time.Time)
}

// FromConfig returns the Config for the daemon's admin section.
func FromConfig(c config.Admin, prefix string) Config {
	return Config{Tokens: c.Tokens, MaxBodyBytes: c.MaxBodyBytes, Prefix: prefix, BatchRate: c.BatchRate, SampleHistory: true}
}

// base is what every part of the console reads: its settings, the stores
// it reads and writes through, its logger, clock and metrics. Its own
// methods are what every part does alike: audit a write and read the
// audit (audit.go, health.go), answer a store's error (respond.go), read
// a letters filter (decode.go) and a path's user (ratelimitapi.go).
type base struct {
	cfg   Config
	dlq   DLQStore
	rl    RateLimitAdmin
	rdb   redis.UniversalClient
	log   *zap.Logger
	clock Clock
	m     metrics
}

// Server is the admin API and console; it is an http.Handler. It
// authenticates, routes and audits (this file); the answers come from its
// parts, each with the state it owns:
//   - letters (dlqapi.go, export.go): the DLQ's letters, their retries,
//     purges and batches;
//   - limits (ratelimitapi.go, blockstory.go): the rate limiter's users,
//     blocks, groups and rules;
//   - watch (health.go, verdict.go, history.go, overview.go, fleet.go):
//     the health verdict, its history, the overview and the fleet;
//   - kafka (kafka.go): the topics and their records;
//   - timelines (timeline.go, timeline_archive.go): a customer's story;
//   - batches (batch.go): the operator batches this replica runs.
type Server struct {
	*base
	auth      *authenticator
	mux       *http.ServeMux
	routes    []string
	letters   *letters
	limits    *limits
	watch     *watch
	kafka     *kafkaView
	timelines *timelines
	batches   *batches
}

// letters answers the DLQ's routes (dlqapi.go, export.go).
type letters struct {
	*base
	batches *batches
}

// limits answers the rate limiter's routes (ratelimitapi.go,
// blockstory.go).
type limits struct {
	*base
}

// watch answers the health, verdict, overview and fleet routes and keeps
// their samples (health.go, verdict.go, history.go, overview.go,
// fleet.go).
type watch struct {
	*base
	commits commitAges
	// life ends when the server closes: the samplers stop.
	life context.Context
}

// kafkaView answers the Kafka routes (kafka.go).
type kafkaView struct {
	*base
}

// timelines answers a customer's timeline (timeline.go,
// timeline_archive.go).
type timelines struct {
	*base
}

// New returns the admin server. rdb holds the audit stream; dlq and rl must
// not be nil.
func New(cfg Config, dlq DLQStore, rl RateLimitAdmin, rdb redis.UniversalClient, logger *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if dlq == nil || rl == nil || rdb == nil {
		return nil, errors.New("admin: nil DLQStore, RateLimitAdmin or redis client")
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	if cfg.AuditMaxLen == 0 {
		cfg.AuditMaxLen = 100000
	}
	if cfg.BatchRate == 0 {
		cfg.BatchRate = 200
	}
	b := &base{cfg: cfg, dlq: dlq, rl: rl, rdb: rdb, log: logger.Named("admin"), clock: cfg.Clock, m: newMetrics(reg)}
	if b.clock == nil {
		b.clock = clock.System
	}
	s := &Server{base: b, auth: newAuthenticator(cfg.Tokens), mux: http.NewServeMux(),
		limits: &limits{base: b}, watch: &watch{base: b}, kafka: &kafkaView{base: b}}
	s.batches = newBatches(b)
	s.watch.life = s.batches.ctx
	s.letters = &letters{base: b, batches: s.batches}
	s.timelines = &timelines{base: b}
	s.register()
	s.batches.wg.Go(s.batches.resumeLoop)
	s.batches.wg.Go(s.watch.sampleCommits)
	if cfg.SampleHistory {
		s.batches.wg.Go(s.watch.sampleHistoryLoop)
	}
	return s, nil
}

// Close stops the batches this server runs, releasing them to another
// replica (or to this daemon when it starts again), and waits for them.
func (s *Server) Close() error {
	s.batches.close()
	return nil
}

func (s *Server) register() {
	// Reads.
	s.read("GET /admin/dlq/stats", s.letters.dlqStats)
	s.read("GET /admin/dlq/messages", s.letters.dlqList)
	s.read("GET /admin/dlq/messages/{id}", s.letters.dlqGet)
	s.read("GET /admin/dlq/export", s.letters.dlqExport)
	s.read("GET /admin/ratelimit/status/{user}", s.limits.rlStatus)
	s.read("GET /admin/ratelimit/blocked", s.limits.rlBlocked)
	s.read("GET /admin/health", s.watch.health)
	s.read("GET /admin/overview", s.watch.overview)
	s.read("GET /admin/verdict", s.watch.getVerdict)
	s.read("GET /admin/kafka", s.kafka.kafkaGet)
	s.read("GET /admin/kafka/records", s.kafka.kafkaRecords)
	s.read("GET /admin/audit", s.auditList)
	s.read("GET /admin/whoami", s.whoami)
	s.read("GET /admin/dlq/batches", s.letters.batchList)
	s.read("GET /admin/dlq/batches/{id}", s.letters.batchGet)
	s.read("GET /admin/dlq/groups", s.letters.dlqGroups)
	s.read("GET /admin/fleet", s.watch.fleetList)
	s.read("GET /admin/ratelimit/rules", s.limits.rlRules)
	s.read("GET /admin/customers/{user}/timeline", s.timelines.customerTimeline)
	// Writes: each is audited under its action name.
	s.write("POST /admin/dlq/retry/{id}", "dlq.retry", s.letters.dlqRetry)
	s.write("POST /admin/dlq/batch-retry", "dlq.batch_retry", s.letters.dlqBatchRetry)
	s.write("POST /admin/dlq/purge", "dlq.purge", s.letters.dlqPurge)
	s.write("POST /admin/dlq/batches/{id}/cancel", "dlq.batch_cancel", s.letters.batchCancel)
	s.write("POST /admin/ratelimit/unblock/{user}", "ratelimit.unblock", s.limits.rlUnblock)
	s.write("POST /admin/ratelimit/block/{user}", "ratelimit.block", s.limits.rlBlock)
	s.write("POST /admin/ratelimit/whitelist/{user}", "ratelimit.whitelist_add", s.limits.rlWhitelistAdd)
	s.write("DELETE /admin/ratelimit/whitelist/{user}", "ratelimit.whitelist_remove", s.limits.rlWhitelistRemove)
	s.write("PUT /admin/ratelimit/group/{user}", "ratelimit.set_group", s.limits.rlSetGroup)
	s.write("PUT /admin/ratelimit/rules", "ratelimit.set_rules", s.limits.rlSetRules)
	// The console: static, unauthenticated, no data.
	s.mux.Handle("GET /admin/ui/", uiHandler())
	s.mux.Handle("GET /admin/ui", http.RedirectHandler("/admin/ui/", http.StatusMovedPermanently))
}

// Routes lists the API's "METHOD /path" patterns (the console excluded).
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// ServeHTTP authenticates API requests, then dispatches. Authentication
// comes before routing so an anonymous caller learns nothing about which
// paths exist.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	h, pattern := s.mux.Handler(r)
	defer func() { s.m.requests.WithLabelValues(routeLabel(pattern), fmt.Sprint(sw.status())).Inc() }()
	if r.URL.Path == "/admin/ui" || strings.HasPrefix(r.URL.Path, "/admin/ui/") {
		s.mux.ServeHTTP(sw, r)
		return
	}
	sw.Header().Set("Cache-Control", "no-store")
	sw.Header().Set("X-Content-Type-Options", "nosniff")
	p, aerr := s.auth.authenticate(r)
	if aerr != nil {
		s.log.Warn("admin auth failed", zap.String("remote", r.RemoteAddr), zap.String("method", r.Method),
			zap.String("path", r.URL.Path), zap.String("error", aerr.Msg))
		writeError(sw, aerr)
		return
	}
	if pattern == "" {
		// The mux's own 404/405 answers are text; give them the JSON shape
		// and keep the Allow header it computed.
		rec := &discardWriter{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if allow := rec.header.Get("Allow"); allow != "" {
			sw.Header().Set("Allow", allow)
		}
		if rec.code == http.StatusMethodNotAllowed {
			writeError(sw, &apiError{Status: http.StatusMethodNotAllowed, Msg: "method " + r.Method + " not allowed"})
			return
		}
		writeError(sw, &apiError{Status: http.StatusNotFound, Msg: "no such endpoint"})
		return
	}
	// Through the mux again (not h) so the path values get set.
	s.mux.ServeHTTP(sw, r.WithContext(withPrincipal(r.Context(), p)))
}

func routeLabel(pattern string) string {
	if pattern == "" {
		return "unmatched"
	}
	if strings.HasPrefix(pattern, "GET /admin/ui") {
		return "ui"
	}
	return pattern
}

// read registers a GET route any authenticated token may call.
func (s *Server) read(pattern string, h http.HandlerFunc) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, h)
}

// writeOp is a validated write, ready to run: target and reason go to the
// audit stream, do performs it and returns the response body.
type writeOp struct {
	target string
	reason string
	// dryRun marks a write that only counts: audited with result
	// "dry_run" when it succeeds, "dry_run_<result>" when it is refused.
	dryRun bool
	do     func(r *http.Request) (any, error)
	// audited, when set, gives the audit entry's target after do ran
	// (a batch write names its batch only when one started).
	audited func() string
}

// write registers an operator-only route. parse validates the request and
// returns the operation; a parse error is answered without an audit entry
// (nothing was attempted), every attempted operation is audited once.
func (s *Server) write(pattern, action string, parse func(r *http.Request) (writeOp, *apiError)) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		p := principalFrom(r.Context())
		if p.role != RoleOperator {
			s.log.Warn("admin write refused: role", zap.String("who", p.name), zap.String("role", p.role),
				zap.String("action", action), zap.String("path", r.URL.Path))
			writeError(w, &apiError{Status: http.StatusForbidden, Msg: "role " + p.role + " may not " + action})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxBodyBytes))
		op, aerr := parse(r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		resp, err := op.do(r)
		aerr = s.storeError(err, action)
		result := "ok"
		if aerr != nil {
			result = resultOf(err)
		}
		if op.dryRun {
			// A dry run acts on nothing: its entry says so whatever its
			// answer, so no reader takes it for an action.
			result = dryRunResult(result)
		}
		target := op.target
		if op.audited != nil {
			target = op.audited()
		}
		s.audit(r.Context(), auditEntry{Who: p.name, Action: action, Target: target, Reason: op.reason, Result: result})
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

// Identity is the answer of GET /admin/whoami: the token's name and role
// (the console hides write controls from viewers; the API refuses them
// anyway).
type Identity struct {
	Name string `json:"name"`
	Role string `json:"role"`
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	writeJSON(w, http.StatusOK, Identity{Name: p.name, Role: p.role})
}

// dryRunResult is the audit result of a dry run whose answer was result.
func dryRunResult(result string) string {
	if result == "ok" {
		return "dry_run"
	}
	return "dry_run_" + result
}

// isDryRun says whether an audit entry's result is a dry run's.
func isDryRun(result string) bool { return strings.HasPrefix(result, "dry_run") }
