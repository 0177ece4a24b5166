package producer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/clock"
)

// SyncRequest is one sync_msg call. OpenKfID is always set; Token is the
// callback token, sent only on the first page of a pass.
type SyncRequest struct {
	Cursor   string
	Token    string
	Limit    int
	OpenKfID string
}

// SyncResponse is one sync_msg page.
type SyncResponse struct {
	NextCursor string
	HasMore    int // 1 = more pages, even when MsgList is empty
	// MsgList is the page's items read by chatmsg.ParseItem, in WeChat's
	// order: the records to produce, new ones on every call (the Syncer
	// sets their MessageID, the Publisher their ProducedAt).
	MsgList []*chatmsg.ChatMessage
	// Invalid is the page's items ParseItem refused: counted and logged,
	// never produced (they cannot be keyed or deduplicated).
	Invalid []*chatmsg.ItemError
}

// Source is WeChat's sync_msg (the wecom client behind an adapter). Errors
// for errcode 95007 and 45009 are ErrTokenInvalid and ErrRateLimited, or
// carry the code (ErrCode() int or Code() int).
type Source interface {
	SyncMsg(ctx context.Context, req SyncRequest) (*SyncResponse, error)
}

// Locker takes the per-open_kfid sync lock without waiting. It returns
// ErrLockBusy (possibly wrapped) when another holder has it. name is the
// full Redis key. The lock is extended automatically while held.
type Locker interface {
	TryLock(ctx context.Context, name string, ttl time.Duration) (Mutex, error)
}

// LockRemainer is an optional interface of a Locker: how long the lock
// name has left before it expires if its holder does not extend it (0 or
// less: free). A Syncer that found the lock busy retries when it can be
// taken; without this it waits the whole sync.lock_ttl.
type LockRemainer interface {
	Remaining(ctx context.Context, name string) (time.Duration, error)
}

// Mutex is a held lock.
type Mutex interface {
	// Lost is closed when the lock could not be extended and may belong
	// to someone else now.
	Lost() <-chan struct{}
	Unlock(ctx context.Context) error
	// SetIfHeld writes key only while the lock is still ours (one Lua
	// script), else returns ErrNotHeld (possibly wrapped). ttl 0 = no expiry.
	SetIfHeld(ctx context.Context, key, value string, ttl time.Duration) error
}

// Publisher produces a batch and waits for its delivery reports
// (KafkaProducer).
type Publisher interface {
	ProduceBatch(ctx context.Context, topic string, msgs []*chatmsg.ChatMessage) error
}

// IDGenerator hands out Snowflake IDs.
type IDGenerator interface {
	Next() (int64, error)
}

// Clock is the time source for backoff and the safety sync.
type Clock = clock.AfterClock

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// SyncerDeps are the collaborators of a Syncer; all are required.
type SyncerDeps struct {
	Source    Source
	Locker    Locker
	State     State
	Publisher Publisher
	IDs       IDGenerator
}

// Option configures a Syncer.
type Option func(*Syncer)

// WithClock replaces the wall clock.
func WithClock(c Clock) Option { return func(s *Syncer) { s.clock = c } }

// WithLogger sets the logger (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(s *Syncer) { s.log = l } }

// WithRegisterer registers the sync metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option { return func(s *Syncer) { s.reg = reg } }

// Syncer runs the sync loop per open_kfid (I1): lock →
// sync_msg pages → produce → wait for the delivery reports → advance the
// cursor (fenced). Triggers are coalesced per open_kfid and served by a
// fixed pool of workers.
type Syncer struct {
	cfg   SyncerConfig
	d     SyncerDeps
	clock Clock
	log   *zap.Logger
	reg   prometheus.Registerer
	m     syncMetrics

	ctx    context.Context // canceled by Stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	startOnce sync.Once

	mu      sync.Mutex
	kfs     map[string]*kfState
	stopped bool
	// queue holds open_kfids with queued set. Each open_kfid is in it at
	// most once and len(kfs) <= MaxPending, so a send under mu never blocks.
	queue chan string

	gateMu      sync.Mutex
	pauseReason error
	resumed     chan struct{} // closed by Resume

	healthMu   sync.Mutex
	produceErr error // last produce outcome; nil after a success
	// failing holds the open_kfids whose last sync failed permanently.
	failing map[string]*permanentFailure
	// retrying holds the open_kfids with a retryWhenFree waiting (under mu).
	retrying map[string]bool
	// acct is the accounts synced (accounts.go).
	acct accountSet
	// hz is what the horizon metrics export (horizon.go).
	hz horizon
	// status, when set, receives the accounts' SyncStatus every
	// statusEvery (WithStatus).
	status      StatusWriter
	statusEvery time.Duration
}

// permanentFailure is an open_kfid whose sync_msg failed with a permanent
// errcode: it is not synced again before retryAt.
type permanentFailure struct {
	code     int
	since    time.Time
	retryAt  time.Time
	failures int
}

// Permanent-error backoff: 1 minute, doubling, at most 30 minutes.
const (
	permanentBackoffBase = time.Minute
	permanentBackoffMax  = 30 * time.Minute
)

// kfState is the local coalescing state of one open_kfid.
type kfState struct {
	queued  bool // in the queue
	running bool // a worker has it
	dirty   bool // triggered while running: run again afterwards
	token   string
	tokenAt time.Time
}

type syncMetrics struct {
	runs     *prometheus.CounterVec
	messages prometheus.Counter
	pending  prometheus.Counter
	advances prometheus.Counter
	busy     prometheus.Counter
	triggers *prometheus.CounterVec
	invalid  *prometheus.CounterVec
	failing  *prometheus.GaugeVec
	// lastSuccess is kfpipe_sync_last_success_timestamp_seconds.
	lastSuccess *prometheus.GaugeVec
}

func newSyncMetrics(reg prometheus.Registerer) syncMetrics {
	m := syncMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_sync_runs_total",
			Help: "Sync passes by result (ok, produce_error, source_error, rate_limited, state_error, lock_lost, paused).",
		}, []string{"result"}),
		messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_sync_messages_total",
			Help: "Messages fetched with sync_msg and acknowledged by Kafka.",
		}),
		pending: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_sync_pending_total",
			Help: "Extra passes run by a lock holder because another trigger left the pending flag.",
		}),
		advances: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_sync_cursor_advances_total",
			Help: "Cursor writes after a page was fully acknowledged.",
		}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_sync_lock_busy_total",
			Help: "Syncs handed to the current lock holder through the pending flag.",
		}),
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_sync_triggers_total",
			Help: "Sync triggers by outcome (queued, coalesced, overloaded, unknown_open_kfid, suppressed: the open_kfid's last sync failed permanently and waits for its backoff).",
		}, []string{"result"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_sync_invalid_items_total",
			Help: "sync_msg items not produced because they cannot be keyed or deduplicated, by reason (malformed: not a JSON object of WeChat's shape; missing_field: no msgid, open_kfid or external_userid). Each is logged with the item.",
		}, []string{"reason"}),
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kfpipe_sync_permanent_failure",
			Help: "1 while an open_kfid's sync fails with a permanent WeChat errcode (bad credentials, unknown account, no permission); the errcode is a label. Retried every few minutes.",
		}, []string{"open_kfid", "errcode"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kfpipe_sync_last_success_timestamp_seconds",
			Help: "Per open_kfid, when this process last finished a sync pass (sync_msg down to has_more=0, every page produced and its cursor stored).",
		}, []string{"open_kfid"}),
	}
	if reg != nil {
		reg.MustRegister(m.runs, m.messages, m.pending, m.advances, m.busy, m.triggers, m.invalid, m.failing, m.lastSuccess)
	}
	return m
}

// NewSyncer checks deps; Start begins syncing.
func NewSyncer(cfg SyncerConfig, d SyncerDeps, opts ...Option) (*Syncer, error) {
	cfg.setDefaults()
	if d.Source == nil || d.Locker == nil || d.State == nil || d.Publisher == nil || d.IDs == nil {
		return nil, errors.New("syncer: Source, Locker, State, Publisher and IDs are required")
	}
	s := &Syncer{cfg: cfg, d: d, clock: realClock{}, log: zap.NewNop(),
		kfs: make(map[string]*kfState), queue: make(chan string, cfg.MaxPending),
		failing: make(map[string]*permanentFailure), retrying: make(map[string]bool),
		hz: horizon{triggered: map[string]time.Time{}, fetched: map[string]time.Time{}, ok: map[string]time.Time{}}}
	for _, o := range opts {
		o(s)
	}
	s.initAccounts()
	s.m = newSyncMetrics(s.reg)
	if s.reg != nil {
		s.reg.MustRegister(newHorizonCollector(s))
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start launches the workers and the safety sync, which triggers every
// configured open_kfid at once and then every SafetyInterval. Triggers
// received before Start wait in the queue. Start after Stop does nothing.
func (s *Syncer) Start() {
	s.startOnce.Do(func() {
		// Under mu, so that a concurrent Stop either sees these goroutines
		// in wg or keeps them from starting.
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopped {
			return
		}
		for range s.cfg.Workers {
			s.wg.Add(1)
			go s.worker()
		}
		s.wg.Add(1)
		go s.safetyLoop()
		if s.status != nil && s.statusEvery > 0 {
			s.wg.Add(1)
			go s.statusLoop()
		}
	})
}

// Stop ends every sync (held locks are released, unacknowledged pages keep
// their cursor) and waits for the goroutines until ctx ends.
func (s *Syncer) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("syncer stop: %w", ctx.Err())
	}
}

// Trigger asks for a sync of openKfID, with the callback token when there
// is one. It never blocks: a trigger for an open_kfid that is queued or
// running is merged into it (a running one runs once more).
func (s *Syncer) Trigger(openKfID, callbackToken string) error {
	if openKfID == "" {
		return errors.New("sync trigger: empty open_kfid")
	}
	if !s.admit(openKfID) {
		s.m.triggers.WithLabelValues("unknown_open_kfid").Inc()
		return fmt.Errorf("%w: %q", ErrUnknownOpenKfID, openKfID)
	}
	s.noteTrigger(openKfID)
	if s.suppressed(openKfID) {
		s.m.triggers.WithLabelValues("suppressed").Inc()
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	st := s.kfs[openKfID]
	if st == nil {
		if len(s.kfs) >= s.cfg.MaxPending {
			s.m.triggers.WithLabelValues("overloaded").Inc()
			return ErrOverloaded
		}
		st = &kfState{}
		s.kfs[openKfID] = st
	}
	if callbackToken != "" {
		st.token, st.tokenAt = callbackToken, s.clock.Now()
	}
	switch {
	case st.running:
		st.dirty = true
	case st.queued:
	default:
		st.queued = true
		s.queue <- openKfID
		s.m.triggers.WithLabelValues("queued").Inc()
		return nil
	}
	s.m.triggers.WithLabelValues("coalesced").Inc()
	return nil
}

// suppressed reports whether kf's last sync failed permanently and its
// backoff has not run out.
func (s *Syncer) suppressed(kf string) bool {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	f := s.failing[kf]
	return f != nil && s.clock.Now().Before(f.retryAt)
}

// recordPermanent notes a permanent sync failure of kf with errcode code:
// logged once per errcode (then at debug), retried after a backoff that
// doubles up to permanentBackoffMax.
func (s *Syncer) recordPermanent(kf string, code int, err error) {
	now := s.clock.Now()
	s.healthMu.Lock()
	f := s.failing[kf]
	first := f == nil || f.code != code
	if first {
		if f != nil {
			s.m.failing.DeleteLabelValues(kf, strconv.Itoa(f.code))
		}
		f = &permanentFailure{code: code, since: now}
		s.failing[kf] = f
	}
	f.failures++
	wait := permanentBackoffBase
	for i := 1; i < f.failures && wait < permanentBackoffMax; i++ {
		wait *= 2
	}
	f.retryAt = now.Add(min(wait, permanentBackoffMax))
	s.healthMu.Unlock()
	s.m.failing.WithLabelValues(kf, strconv.Itoa(code)).Set(1)
	lvl := zap.DebugLevel
	if first {
		lvl = zap.ErrorLevel
	}
	s.log.Log(lvl, "sync failed with a permanent WeChat error; retrying after a backoff of minutes, an operator must act",
		zap.String("open_kfid", kf), zap.Int("errcode", code), zap.String("meaning", permanentCodes[code]),
		zap.Time("next_try", f.retryAt), zap.Error(err))
}

// clearPermanent forgets kf's permanent failure after a successful sync.
func (s *Syncer) clearPermanent(kf string) {
	s.healthMu.Lock()
	f := s.failing[kf]
	delete(s.failing, kf)
	s.healthMu.Unlock()
	if f != nil {
		s.m.failing.DeleteLabelValues(kf, strconv.Itoa(f.code))
		s.log.Info("sync recovered from a permanent WeChat error", zap.String("open_kfid", kf), zap.Int("errcode", f.code))
	}
}

// Failing describes the open_kfids whose sync fails permanently, one line
// each, for /readyz detail ("" when none).
func (s *Syncer) Failing() string {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	var lines []string
	for kf, f := range s.failing {
		lines = append(lines, fmt.Sprintf("open_kfid %s: WeChat errcode %d (%s) since %s, next try %s", kf, f.code,
			permanentCodes[f.code], f.since.UTC().Format(time.RFC3339), f.retryAt.UTC().Format(time.RFC3339)))
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// Pause stops starting sync passes (a running pass stops before its next
// page and releases the lock) until Resume; Healthy reports reason. The
// lead calls it when the Snowflake worker ID can no longer be kept alive.
func (s *Syncer) Pause(reason error) {
	if reason == nil {
		reason = ErrPaused
	}
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.pauseReason == nil {
		s.resumed = make(chan struct{})
	}
	s.pauseReason = reason
}

// Resume undoes Pause; triggers received meanwhile are served.
func (s *Syncer) Resume() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.pauseReason != nil {
		close(s.resumed)
		s.pauseReason = nil
	}
}

func (s *Syncer) paused() error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	return s.pauseReason
}

// waitResumed blocks while paused; false when stopping.
func (s *Syncer) waitResumed() bool {
	s.gateMu.Lock()
	ch, paused := s.resumed, s.pauseReason != nil
	s.gateMu.Unlock()
	if !paused {
		return s.ctx.Err() == nil
	}
	select {
	case <-ch:
		return s.ctx.Err() == nil
	case <-s.ctx.Done():
		return false
	}
}

// Healthy is the readiness hook: an error while paused or while the latest
// page could not be produced (Kafka unreachable: the cursor is held).
func (s *Syncer) Healthy() error {
	if r := s.paused(); r != nil {
		return fmt.Errorf("%w: %w", ErrPaused, r)
	}
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if s.produceErr != nil {
		return fmt.Errorf("sync cannot produce: %w", s.produceErr)
	}
	return nil
}

func (s *Syncer) setProduceErr(err error) {
	s.healthMu.Lock()
	s.produceErr = err
	s.healthMu.Unlock()
}

func (s *Syncer) safetyLoop() {
	defer s.wg.Done()
	for {
		for _, kf := range s.Accounts() {
			if err := s.Trigger(kf, ""); err != nil && !errors.Is(err, ErrStopped) {
				s.log.Warn("safety sync trigger", zap.String("open_kfid", kf), zap.Error(err))
			}
		}
		if s.cfg.SafetyInterval <= 0 {
			return
		}
		select {
		case <-s.clock.After(s.cfg.SafetyInterval):
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *Syncer) worker() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case kf := <-s.queue:
			s.process(kf)
		}
	}
}

func (s *Syncer) process(kf string) {
	s.mu.Lock()
	st := s.kfs[kf]
	st.queued, st.running = false, true
	token := st.token
	if token != "" && s.clock.Now().Sub(st.tokenAt) > s.cfg.TokenTTL {
		token = ""
	}
	st.token = ""
	s.mu.Unlock()

	again := false
	if !s.removedAccount(kf) { // an account removed while queued is not synced
		again = s.syncKf(kf, token)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	st.running = false
	if (st.dirty || again) && !s.stopped {
		st.dirty, st.queued = false, true
		s.queue <- kf
		return
	}
	delete(s.kfs, kf)
}

// syncKf runs the lock protocol for kf and reports whether kf must be
// queued again (paused midway).
//
// No trigger is lost: a worker that finds the lock busy sets the pending
// flag and then tries the lock once more, so either it syncs itself or the
// holder it lost to is still holding and checks the flag later. A holder
// clears the flag when it gets the lock (its pass starts after every flag
// set so far), clears-and-checks it after each pass (GETDEL), and checks it
// once more after Unlock, going round again when it is set.
func (s *Syncer) syncKf(kf, token string) (again bool) {
	lockKey := s.cfg.KeyPrefix + "lock:sync:" + kf
	if lk, ok := s.d.State.(interface{ LockKey(string) string }); ok {
		lockKey = lk.LockKey(kf) // in the cursor's slot on a Redis Cluster
	}
	var failures int
	for {
		if !s.waitResumed() {
			return false
		}
		m, err := s.acquire(kf, lockKey)
		if err != nil {
			s.log.Warn("sync lock", zap.String("open_kfid", kf), zap.Error(err))
			s.m.runs.WithLabelValues("state_error").Inc()
			if !s.sleep(s.ctx, failures) {
				return false
			}
			failures++
			continue
		}
		if m == nil {
			s.m.busy.Inc()
			s.forgetWaiting(kf)
			s.retryWhenFree(kf, lockKey)
			return false
		}
		err = s.hold(m, kf, token)
		token = "" // a callback token serves its first pass only
		uctx, cancel := context.WithTimeout(context.Background(), s.cfg.LockTTL)
		if uerr := m.Unlock(uctx); uerr != nil {
			s.log.Debug("sync unlock", zap.String("open_kfid", kf), zap.Error(uerr))
		}
		cancel()
		switch {
		case s.ctx.Err() != nil:
			return false
		case errors.Is(err, ErrPaused):
			return true
		case errors.Is(err, ErrPermanent):
			return false // retried after its backoff (Trigger suppresses it until then)
		case err != nil:
			// Lost the lock (or the state store failed): try again; when a
			// new holder has it we only leave the pending flag.
			s.log.Warn("sync aborted", zap.String("open_kfid", kf), zap.Error(err))
			if !s.sleep(s.ctx, failures) {
				return false
			}
			failures++
			continue
		}
		failures = 0
		pending, err := s.d.State.HasPending(s.ctx, kf)
		if err != nil || !pending {
			return false
		}
		s.m.pending.Inc()
	}
}

// acquire returns the held lock, or nil when another holder has it (and
// has been told through the pending flag).
func (s *Syncer) acquire(kf, lockKey string) (Mutex, error) {
	m, err := s.d.Locker.TryLock(s.ctx, lockKey, s.cfg.LockTTL)
	if errors.Is(err, ErrLockBusy) {
		if err := s.d.State.MarkPending(s.ctx, kf, 3*s.cfg.LockTTL); err != nil {
			return nil, err
		}
		m, err = s.d.Locker.TryLock(s.ctx, lockKey, s.cfg.LockTTL)
		if errors.Is(err, ErrLockBusy) {
			return nil, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("try lock: %w", err)
	}
	// Every flag set so far is served by the pass that starts now.
	if _, err := s.d.State.TakePending(s.ctx, kf); err != nil {
		s.unlock(m)
		return nil, err
	}
	return m, nil
}

// lockRetryMargin is added to a busy lock's remaining time: Redis and etcd
// expire keys within milliseconds of their TTL.
const lockRetryMargin = 100 * time.Millisecond

// retryWhenFree makes sure the pending flag just left for the holder of
// kf's lock is served even when that holder is dead (a kill -9 leaves its
// lock held until the TTL runs out, and no safety tick or callback may come
// for a minute): once the lock's remaining time has passed, kf is triggered
// again if its flag is still set. A live holder takes the flag after its
// pass (then nothing happens here) or still holds the lock (then the
// trigger finds it busy and waits again, one TryLock per lock TTL).
func (s *Syncer) retryWhenFree(kf, lockKey string) {
	wait := s.cfg.LockTTL
	if r, ok := s.d.Locker.(LockRemainer); ok {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.LockTTL)
		left, err := r.Remaining(ctx, lockKey)
		cancel()
		switch {
		case err != nil:
			s.log.Debug("sync lock: remaining time unknown, retrying after the lock TTL", zap.String("open_kfid", kf), zap.Error(err))
		case left < wait:
			wait = max(left, 0)
		}
	}
	wait += lockRetryMargin
	s.mu.Lock()
	if s.stopped || s.retrying[kf] {
		s.mu.Unlock()
		return
	}
	s.retrying[kf] = true
	s.wg.Add(1)
	s.mu.Unlock()
	s.log.Info("sync lock held by another process: retrying when it expires unless the holder syncs first",
		zap.String("open_kfid", kf), zap.Duration("retry_in", wait))
	go func() {
		defer s.wg.Done()
		select {
		case <-s.clock.After(wait):
		case <-s.ctx.Done():
		}
		s.mu.Lock()
		delete(s.retrying, kf)
		s.mu.Unlock()
		if s.ctx.Err() != nil {
			return
		}
		pending, err := s.d.State.HasPending(s.ctx, kf)
		if err == nil && !pending {
			return // the holder served it
		}
		if err := s.Trigger(kf, ""); err != nil && !errors.Is(err, ErrStopped) {
			s.log.Warn("sync retry after a busy lock", zap.String("open_kfid", kf), zap.Error(err))
		}
	}()
}

func (s *Syncer) unlock(m Mutex) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LockTTL)
	defer cancel()
	_ = m.Unlock(ctx)
}

// errLockLost is returned when the lock's Lost fired mid-pass.
var errLockLost = errors.New("sync lock lost")

// hold syncs while holding m, once more for every pending flag found.
func (s *Syncer) hold(m Mutex, kf, token string) error {
	ctx, cancel := context.WithCancel(s.ctx)
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-m.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-watcher }()
	lost := func(err error) error {
		select {
		case <-m.Lost():
			if !errors.Is(err, ErrNotHeld) { // already counted
				s.m.runs.WithLabelValues("lock_lost").Inc()
			}
			return fmt.Errorf("%w: %w", errLockLost, err)
		default:
			return err
		}
	}
	for {
		if err := s.syncUntilDone(ctx, m, kf, token); err != nil {
			return lost(err)
		}
		token = ""
		taken, err := s.d.State.TakePending(ctx, kf)
		if err != nil {
			return lost(err)
		}
		if !taken {
			return nil
		}
		s.m.pending.Inc()
	}
}

// syncUntilDone repeats a pass until it reaches has_more=0, backing off
// after failures; every retry restarts from the stored cursor.
func (s *Syncer) syncUntilDone(ctx context.Context, m Mutex, kf, token string) error {
	for attempt := 0; ; attempt++ {
		if r := s.paused(); r != nil {
			s.m.runs.WithLabelValues("paused").Inc()
			return ErrPaused
		}
		start := s.clock.Now()
		err := s.pass(ctx, m, kf, &token)
		if err == nil {
			s.noteSuccess(kf, start)
			s.m.runs.WithLabelValues("ok").Inc()
			s.clearPermanent(kf)
			return nil
		}
		if code, ok := permanentCode(err); ok {
			s.m.runs.WithLabelValues("permanent_error").Inc()
			s.recordPermanent(kf, code, err)
			return fmt.Errorf("%w: %w", ErrPermanent, err)
		}
		// ErrNotHeld first: the lock's loss also cancels ctx (hold's
		// watcher), and hold counts a loss only when it was not counted here.
		if errors.Is(err, ErrNotHeld) {
			s.m.runs.WithLabelValues("lock_lost").Inc()
			return err
		}
		if ctx.Err() != nil || errors.Is(err, ErrPaused) {
			return err
		}
		var se *stepError
		result := "state_error"
		if errors.As(err, &se) {
			result = se.kind
		}
		s.m.runs.WithLabelValues(result).Inc()
		s.log.Warn("sync pass failed; cursor kept", zap.String("open_kfid", kf),
			zap.String("result", result), zap.Int("attempt", attempt), zap.Error(err))
		if !s.sleep(ctx, attempt) {
			return ctx.Err()
		}
	}
}

// stepError labels why a pass failed.
type stepError struct {
	kind string
	err  error
}

func (e *stepError) Error() string { return e.kind + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// pass reads the cursor and pages through sync_msg. A page's cursor is
// stored only after all its messages are acknowledged (I1).
func (s *Syncer) pass(ctx context.Context, m Mutex, kf string, token *string) error {
	cursor, err := s.d.State.Cursor(ctx, kf)
	if err != nil {
		return err
	}
	cursorKey := s.d.State.CursorKey(kf)
	start, produced := time.Now(), 0
	for page := 0; ; page++ {
		if s.paused() != nil {
			return ErrPaused
		}
		req := SyncRequest{Cursor: cursor, Limit: s.cfg.PageLimit, OpenKfID: kf}
		if page == 0 {
			req.Token = *token
		}
		resp, err := s.d.Source.SyncMsg(ctx, req)
		if err != nil && req.Token != "" && isTokenInvalid(err) {
			*token, req.Token = "", ""
			resp, err = s.d.Source.SyncMsg(ctx, req)
		}
		if err != nil {
			kind := "source_error"
			if isRateLimited(err) {
				kind = "rate_limited"
			}
			return &stepError{kind: kind, err: fmt.Errorf("sync_msg: %w", err)}
		}
		if msgs := resp.MsgList; len(msgs) > 0 {
			if err := s.number(msgs); err != nil {
				s.noteUnacknowledged(kf, msgs)
				return &stepError{kind: "idgen_error", err: err}
			}
			dctx, cancel := context.WithTimeout(ctx, s.cfg.DeliveryWait)
			err = s.d.Publisher.ProduceBatch(dctx, s.cfg.Topic, msgs)
			cancel()
			if err != nil {
				s.noteUnacknowledged(kf, msgs)
				if ctx.Err() == nil { // not our own cancellation (stop, lock lost)
					s.setProduceErr(err)
				}
				return &stepError{kind: "produce_error", err: err}
			}
			s.setProduceErr(nil)
			s.m.messages.Add(float64(len(msgs)))
			produced += len(msgs)
		}
		s.noteInvalid(kf, resp.Invalid)
		if resp.NextCursor != "" && resp.NextCursor != cursor {
			if err := m.SetIfHeld(ctx, cursorKey, resp.NextCursor, 0); err != nil {
				return fmt.Errorf("store cursor: %w", err)
			}
			cursor = resp.NextCursor
			s.m.advances.Inc()
		}
		if resp.HasMore != 1 {
			s.log.Info("sync pass done", zap.String("open_kfid", kf), zap.Int("pages", page+1),
				zap.Int("messages", produced), zap.Duration("took", time.Since(start)))
			return nil
		}
	}
}

// number gives each message of a page its Snowflake ID (new on every
// pull; the dedup key is the upstream one).
func (s *Syncer) number(msgs []*chatmsg.ChatMessage) error {
	for _, m := range msgs {
		id, err := s.d.IDs.Next()
		if err != nil {
			return fmt.Errorf("message id: %w", err)
		}
		m.MessageID = id
	}
	return nil
}

// noteInvalid counts and logs the items of a produced page that were not
// produced. They are not retried: WeChat returns them the same way again.
func (s *Syncer) noteInvalid(kf string, items []*chatmsg.ItemError) {
	for _, it := range items {
		reason := "malformed"
		if errors.Is(it, chatmsg.ErrMissingField) {
			reason = "missing_field"
		}
		s.m.invalid.WithLabelValues(reason).Inc()
		item := it.Item
		if len(item) > maxLoggedItem {
			item = item[:maxLoggedItem]
		}
		s.log.Warn("sync_msg item not produced: it cannot be keyed or deduplicated", zap.String("open_kfid", kf),
			zap.Error(it.Err), zap.ByteString("item", item))
	}
}

// maxLoggedItem bounds the bytes of a refused item in its log line.
const maxLoggedItem = 2048

// backoff is the wait after the attempt-th consecutive failure: RetryBase
// doubling up to RetryMax, minus up to half of it as jitter so replicas do
// not retry in step.
func (s *Syncer) backoff(attempt int) time.Duration {
	d := s.cfg.RetryBase
	for i := 0; i < attempt && d < s.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, s.cfg.RetryMax)
	return d - time.Duration(rand.Int64N(int64(d)/2+1))
}

// sleep waits backoff(attempt); false when ctx ends first.
func (s *Syncer) sleep(ctx context.Context, attempt int) bool {
	select {
	case <-s.clock.After(s.backoff(attempt)):
		return true
	case <-ctx.Done():
		return false
	}
}
