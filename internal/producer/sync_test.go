package producer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func unitCfg() SyncerConfig {
	return SyncerConfig{Topic: "t", KeyPrefix: "p:", PageLimit: 100, LockTTL: time.Second,
		RetryBase: time.Millisecond, RetryMax: 4 * time.Millisecond, Workers: 2, DeliveryWait: time.Second}
}

type rig struct {
	s   *Syncer
	st  *memStore
	lk  *fakeLocker
	src *pageSource
	pub *recPublisher
}

// newRig builds a started Syncer on the given fakes (new ones when nil).
func newRig(t *testing.T, cfg SyncerConfig, st *memStore, src *pageSource, opts ...Option) *rig {
	t.Helper()
	if st == nil {
		st = newMemStore()
	}
	if src == nil {
		src = &pageSource{}
	}
	r := &rig{st: st, lk: &fakeLocker{s: st}, src: src, pub: &recPublisher{}}
	s, err := NewSyncer(cfg, SyncerDeps{Source: src, Locker: r.lk, State: st, Publisher: r.pub, IDs: &seqIDs{}},
		append([]Option{WithRegisterer(prometheus.NewRegistry())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	s.Start()
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

func (s *Syncer) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kfs) == 0
}

func ids(ms []*chatmsg.ChatMessage) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.UpstreamMsgID)
	}
	return out
}

func TestSyncPaging(t *testing.T) {
	a, b, c := msgs("kf", "a", 3), msgs("kf", "b", 2), msgs("kf", "c", 1)
	tests := []struct {
		name       string
		pages      map[string]SyncResponse
		wantIDs    []string
		wantWrites []string
	}{
		{
			name:       "one page",
			pages:      map[string]SyncResponse{"": {NextCursor: "c1", MsgList: a}},
			wantIDs:    ids(a),
			wantWrites: []string{"c1"},
		},
		{
			name: "has_more with empty pages keeps paging",
			pages: map[string]SyncResponse{
				"":   {NextCursor: "c1", HasMore: 1, MsgList: a},
				"c1": {NextCursor: "c2", HasMore: 1},
				"c2": {NextCursor: "c3", HasMore: 1},
				"c3": {NextCursor: "c4", HasMore: 0, MsgList: b},
			},
			wantIDs:    append(ids(a), ids(b)...),
			wantWrites: []string{"c1", "c2", "c3", "c4"},
		},
		{
			name: "unchanged or empty next_cursor is not written",
			pages: map[string]SyncResponse{
				"":   {NextCursor: "c1", HasMore: 1, MsgList: c},
				"c1": {NextCursor: "", HasMore: 0},
			},
			wantIDs:    ids(c),
			wantWrites: []string{"c1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &pageSource{}
			for cur, p := range tt.pages {
				src.set("kf", cur, p)
			}
			r := newRig(t, unitCfg(), nil, src)
			if err := r.s.Trigger("kf", ""); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
			if got := r.pub.ids(); !slices.Equal(got, tt.wantIDs) {
				t.Errorf("produced %v, want %v", got, tt.wantIDs)
			}
			if !slices.Equal(r.st.writes, tt.wantWrites) {
				t.Errorf("cursor writes %v, want %v", r.st.writes, tt.wantWrites)
			}
			for _, req := range src.requests() {
				if req.OpenKfID != "kf" || req.Limit != 100 {
					t.Errorf("request %+v: open_kfid and limit must always be set", req)
				}
			}
			if r.lk.held("p:lock:sync:kf") {
				t.Error("lock still held after the sync")
			}
		})
	}
}

// TestInvalidItemsCountedNotProduced: an item the Source could not read
// (not JSON, no external_userid) is counted and logged with the item, not
// produced, and does not hold the cursor: the rest of its page goes out.
func TestInvalidItemsCountedNotProduced(t *testing.T) {
	var invalid []*chatmsg.ItemError
	for _, item := range []string{`{"msgid":"x",`, `{"msgid":"y","msgtype":"event","event":{"event_type":"servicer_status_change","open_kfid":"kf"}}`} {
		_, err := chatmsg.ParseItem([]byte(item))
		var ie *chatmsg.ItemError
		if !errors.As(err, &ie) {
			t.Fatalf("ParseItem(%s) = %v, want an *ItemError", item, err)
		}
		invalid = append(invalid, ie)
	}
	a := msgs("kf", "a", 2)
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: a, Invalid: invalid})
	core, logs := observer.New(zap.WarnLevel)
	r := newRig(t, unitCfg(), nil, src, WithLogger(zap.New(core)))
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if got := r.pub.ids(); !slices.Equal(got, ids(a)) {
		t.Fatalf("produced %v, want %v", got, ids(a))
	}
	if !slices.Equal(r.st.writes, []string{"c1"}) {
		t.Fatalf("cursor writes %v, want [c1]", r.st.writes)
	}
	for reason, want := range map[string]float64{"malformed": 1, "missing_field": 1} {
		if n := testenv.MetricValue(r.s.m.invalid.WithLabelValues(reason)); n != want {
			t.Errorf("invalid items %s = %v, want %v", reason, n, want)
		}
	}
	lines := logs.FilterMessageSnippet("not produced").All()
	if len(lines) != 2 || !strings.Contains(lines[1].ContextMap()["item"].(string), "servicer_status_change") ||
		!strings.Contains(lines[1].ContextMap()["error"].(string), "external_userid") {
		t.Fatalf("logged %+v", lines)
	}
}

func TestProduceFailureKeepsCursor(t *testing.T) {
	src := &pageSource{}
	a := msgs("kf", "a", 2)
	src.set("kf", "", SyncResponse{NextCursor: "c1", HasMore: 1, MsgList: a})
	src.set("kf", "c1", SyncResponse{NextCursor: "c2", MsgList: msgs("kf", "b", 1)})
	r := newRig(t, unitCfg(), nil, src)
	var failing atomic.Bool
	failing.Store(true)
	r.pub.fail = func(int) error {
		if failing.Load() {
			return fmt.Errorf("%w: broker down", ErrDelivery)
		}
		return nil
	}
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		r.pub.mu.Lock()
		defer r.pub.mu.Unlock()
		return testenv.Check(r.pub.calls >= 3, "three failed produce attempts: %d", r.pub.calls)
	})
	if c := r.st.cursor("kf"); c != "" {
		t.Fatalf("cursor advanced to %q although nothing was acknowledged", c)
	}
	if err := r.s.Healthy(); !errors.Is(err, ErrDelivery) {
		t.Fatalf("Healthy() = %v, want an ErrDelivery", err)
	}
	for _, req := range src.requests() {
		if req.Cursor != "" {
			t.Fatalf("retry did not restart from the stored cursor: %+v", req)
		}
	}
	failing.Store(false)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if c := r.st.cursor("kf"); c != "c2" {
		t.Fatalf("cursor = %q, want c2", c)
	}
	if err := r.s.Healthy(); err != nil {
		t.Fatalf("Healthy() after recovery = %v", err)
	}
	if got, want := r.pub.ids(), []string{"a-0", "a-1", "b-0"}; !slices.Equal(got, want) {
		t.Fatalf("produced %v, want %v", got, want)
	}
}

func TestInvalidTokenRetriesWithoutToken(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"sentinel", fmt.Errorf("wecom: %w", ErrTokenInvalid)},
		{"errcode", fmt.Errorf("wecom: %w", codeErr(95007))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := &pageSource{hook: func(req SyncRequest) error {
				if req.Token != "" {
					return tt.err
				}
				return nil
			}}
			src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
			r := newRig(t, unitCfg(), nil, src)
			if err := r.s.Trigger("kf", "tok"); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
			reqs := src.requests()
			if len(reqs) != 2 || reqs[0].Token != "tok" || reqs[1].Token != "" || reqs[1].Cursor != "" {
				t.Fatalf("requests %+v: want the token once, then the same cursor without it", reqs)
			}
			if c := r.st.cursor("kf"); c != "c1" {
				t.Fatalf("cursor = %q, want c1", c)
			}
			if n := testenv.MetricValue(r.s.m.runs.WithLabelValues("source_error")); n != 0 {
				t.Fatalf("95007 counted as %v source errors; it must be retried at once", n)
			}
		})
	}
}

func TestTokenOnlyOnFirstPage(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", HasMore: 1, MsgList: msgs("kf", "a", 1)})
	src.set("kf", "c1", SyncResponse{NextCursor: "c2", MsgList: msgs("kf", "b", 1)})
	r := newRig(t, unitCfg(), nil, src)
	if err := r.s.Trigger("kf", "tok"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	reqs := src.requests()
	if len(reqs) != 2 || reqs[0].Token != "tok" || reqs[1].Token != "" {
		t.Fatalf("requests %+v", reqs)
	}
}

func TestRateLimitedBacksOff(t *testing.T) {
	var calls atomic.Int32
	src := &pageSource{hook: func(SyncRequest) error {
		if calls.Add(1) <= 2 {
			return codeErr(45009)
		}
		return nil
	}}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
	r := newRig(t, unitCfg(), nil, src)
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if n := testenv.MetricValue(r.s.m.runs.WithLabelValues("rate_limited")); n != 2 {
		t.Fatalf("rate_limited runs = %v, want 2", n)
	}
	if c := r.st.cursor("kf"); c != "c1" {
		t.Fatalf("cursor = %q, want c1", c)
	}
}

// A trigger that arrives while another instance holds the lock must make
// that holder run a second pass that sees the new messages.
func TestPendingFlagMakesHolderLoop(t *testing.T) {
	st := newMemStore()
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 2)})
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	src.hook = func(SyncRequest) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return nil
	}
	holder := newRig(t, unitCfg(), st, src)
	other := newRig(t, unitCfg(), st, src)

	if err := holder.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	<-entered // holder has the lock and is inside its first sync_msg call
	// New messages arrive after the holder's pass started; their callback
	// reaches the other instance.
	src.set("kf", "c1", SyncResponse{NextCursor: "c2", MsgList: msgs("kf", "b", 1)})
	if err := other.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(other.s.idle(), "other instance gave up") })
	if p, _ := st.HasPending(context.Background(), "kf"); !p {
		t.Fatal("busy trigger did not leave the pending flag")
	}
	if n := testenv.MetricValue(other.s.m.busy); n != 1 {
		t.Fatalf("lock_busy = %v, want 1", n)
	}
	close(release)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(holder.s.idle(), "holder done") })
	if got, want := holder.pub.ids(), []string{"a-0", "a-1", "b-0"}; !slices.Equal(got, want) {
		t.Fatalf("holder produced %v, want %v", got, want)
	}
	if len(other.pub.ids()) != 0 {
		t.Fatalf("busy instance produced %v", other.pub.ids())
	}
	if c := st.cursor("kf"); c != "c2" {
		t.Fatalf("cursor = %q, want c2", c)
	}
	if n := testenv.MetricValue(holder.s.m.pending); n != 1 {
		t.Fatalf("pending passes = %v, want 1", n)
	}
	if p, _ := st.HasPending(context.Background(), "kf"); p {
		t.Fatal("pending flag left behind")
	}
}

// When the lock frees up between the busy answer and the flag, the
// triggering worker must sync itself rather than leave the flag to nobody.
func TestBusyThenFreeSyncsItself(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
	r := newRig(t, unitCfg(), nil, src)
	r.lk.busyFor.Store(1)
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if got := r.pub.ids(); !slices.Equal(got, []string{"a-0"}) {
		t.Fatalf("produced %v", got)
	}
	if p, _ := r.st.HasPending(context.Background(), "kf"); p {
		t.Fatal("pending flag left behind with no holder")
	}
	if r.lk.tries.Load() != 2 {
		t.Fatalf("TryLock calls = %d, want 2", r.lk.tries.Load())
	}
}

// A holder whose lock expired mid-page must not write the cursor; the page
// is produced again under a fresh lock and the cursor written once.
func TestLostLockIsFenced(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 2)})
	r := newRig(t, unitCfg(), nil, src)
	r.pub.fail = func(call int) error {
		if call == 1 {
			r.st.mu.Lock()
			m := r.st.locks["p:lock:sync:kf"]
			r.st.mu.Unlock()
			m.lose()
		}
		return nil
	}
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if !slices.Equal(r.st.writes, []string{"c1"}) {
		t.Fatalf("cursor writes %v, want exactly one c1", r.st.writes)
	}
	if n := testenv.MetricValue(r.s.m.runs.WithLabelValues("lock_lost")); n != 1 {
		t.Fatalf("lock_lost runs = %v, want 1", n)
	}
	r.pub.mu.Lock()
	calls := r.pub.calls
	r.pub.mu.Unlock()
	if calls != 2 {
		t.Fatalf("ProduceBatch calls = %d, want 2 (lost pass, then retry)", calls)
	}
}

func TestTriggerBounds(t *testing.T) {
	cfg := unitCfg()
	cfg.MaxPending = 1
	st := newMemStore()
	s, err := NewSyncer(cfg, SyncerDeps{Source: &pageSource{}, Locker: &fakeLocker{s: st}, State: st,
		Publisher: &recPublisher{}, IDs: &seqIDs{}})
	if err != nil {
		t.Fatal(err)
	}
	// Not started: triggers queue up.
	if err := s.Trigger("kf1", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Trigger("kf1", "tok"); err != nil {
		t.Fatalf("a repeated trigger must coalesce: %v", err)
	}
	if err := s.Trigger("kf2", ""); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("Trigger beyond MaxPending = %v, want ErrOverloaded", err)
	}
	if err := s.Trigger("", ""); err == nil {
		t.Fatal("empty open_kfid accepted")
	}
	if len(s.queue) != 1 {
		t.Fatalf("queue holds %d entries, want 1", len(s.queue))
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Trigger("kf1", ""); !errors.Is(err, ErrStopped) {
		t.Fatalf("Trigger after Stop = %v, want ErrStopped", err)
	}
}

func TestPauseResume(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
	r := newRig(t, unitCfg(), nil, src)
	reason := errors.New("worker id keep-alive failed")
	r.s.Pause(reason)
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(src.requests()); n != 0 {
		t.Fatalf("%d sync_msg calls while paused", n)
	}
	if err := r.s.Healthy(); !errors.Is(err, reason) || !errors.Is(err, ErrPaused) {
		t.Fatalf("Healthy() while paused = %v", err)
	}
	r.s.Resume()
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync after resume") })
	if c := r.st.cursor("kf"); c != "c1" {
		t.Fatalf("cursor = %q, want c1", c)
	}
	if err := r.s.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v", err)
	}
}

func TestPauseMidPassReleasesLock(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", HasMore: 1, MsgList: msgs("kf", "a", 1)})
	src.set("kf", "c1", SyncResponse{NextCursor: "c2", MsgList: msgs("kf", "b", 1)})
	r := newRig(t, unitCfg(), nil, src)
	r.pub.fail = func(call int) error {
		if call == 1 {
			r.s.Pause(nil) // takes effect before the next page
		}
		return nil
	}
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(r.st.cursor("kf") == "c1" && !r.lk.held("p:lock:sync:kf"), "lock released")
	})
	time.Sleep(20 * time.Millisecond)
	if c := r.st.cursor("kf"); c != "c1" {
		t.Fatalf("cursor = %q while paused, want c1", c)
	}
	r.s.Resume()
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync done") })
	if c := r.st.cursor("kf"); c != "c2" {
		t.Fatalf("cursor = %q, want c2", c)
	}
}

func TestSafetySync(t *testing.T) {
	cfg := unitCfg()
	cfg.OpenKfIDs = []string{"kf1", "kf2"}
	cfg.SafetyInterval = 10 * time.Millisecond
	src := &pageSource{}
	src.set("kf1", "", SyncResponse{NextCursor: "x1", MsgList: msgs("kf1", "a", 1)})
	src.set("kf2", "", SyncResponse{NextCursor: "y1", MsgList: msgs("kf2", "b", 1)})
	r := newRig(t, cfg, nil, src)
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(r.st.cursor("kf1") == "x1" && r.st.cursor("kf2") == "y1", "both synced without a callback")
	})
	src.set("kf1", "x1", SyncResponse{NextCursor: "x2", MsgList: msgs("kf1", "c", 1)})
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(r.st.cursor("kf1") == "x2", "a later message picked up by the periodic sync: cursor %q, want x2", r.st.cursor("kf1"))
	})
}

func TestBackoff(t *testing.T) {
	s := &Syncer{cfg: SyncerConfig{RetryBase: 100 * time.Millisecond, RetryMax: time.Second}}
	for _, tt := range []struct {
		attempt int
		ceil    time.Duration
	}{
		{0, 100 * time.Millisecond}, {1, 200 * time.Millisecond}, {2, 400 * time.Millisecond},
		{3, 800 * time.Millisecond}, {4, time.Second}, {60, time.Second},
	} {
		for range 50 {
			got := s.backoff(tt.attempt)
			if got > tt.ceil || got < tt.ceil/2 {
				t.Fatalf("backoff(%d) = %s, want in [%s, %s]", tt.attempt, got, tt.ceil/2, tt.ceil)
			}
		}
	}
}

// TestPermanentErrorNotRetriedInALoop: sync_msg answers 95000 (the account
// is not this corp's). The sync stops at once instead of retrying every
// few seconds while holding the lock, triggers are suppressed during the
// backoff (minutes), the failure is visible (gauge, runs, Failing for
// /readyz), and a later successful sync clears it. Before, the pass was
// retried with the ordinary backoff for as long as the producer ran.
func TestPermanentErrorNotRetriedInALoop(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	src := &pageSource{hook: func(SyncRequest) error {
		calls.Add(1)
		if fail.Load() {
			return codeErr(95000)
		}
		return nil
	}}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
	r := newRig(t, unitCfg(), nil, src)
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "sync given up") })
	time.Sleep(100 * time.Millisecond) // 25x the ordinary retry_max
	if n := calls.Load(); n != 1 {
		t.Fatalf("sync_msg called %d times after a permanent error, want 1", n)
	}
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "idle") })
	if n := calls.Load(); n != 1 {
		t.Fatalf("a trigger during the backoff synced again (%d calls)", n)
	}
	if v := testenv.MetricValue(r.s.m.runs.WithLabelValues("permanent_error")); v != 1 {
		t.Fatalf("permanent_error runs = %v", v)
	}
	if v := testenv.MetricValue(r.s.m.triggers.WithLabelValues("suppressed")); v != 1 {
		t.Fatalf("suppressed triggers = %v", v)
	}
	if d := r.s.Failing(); !strings.Contains(d, "open_kfid kf: WeChat errcode 95000") {
		t.Fatalf("Failing() = %q", d)
	}
	// The operator fixes it; the next try after the backoff succeeds.
	fail.Store(false)
	r.s.healthMu.Lock()
	r.s.failing["kf"].retryAt = time.Time{}
	r.s.healthMu.Unlock()
	if err := r.s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(r.st.cursor("kf") == "c1", "synced: cursor %q, want c1", r.st.cursor("kf"))
	})
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "idle") })
	if d := r.s.Failing(); d != "" {
		t.Fatalf("Failing() = %q after a successful sync", d)
	}
}

// TestUnknownOpenKfIDIgnored: a callback for an open_kfid that
// wecom.open_kfids does not list triggers no sync and is counted.
func TestUnknownOpenKfIDIgnored(t *testing.T) {
	var other atomic.Int32
	src := &pageSource{hook: func(req SyncRequest) error {
		if req.OpenKfID == "other" {
			other.Add(1)
		}
		return nil
	}}
	src.set("kf", "", SyncResponse{})
	cfg := unitCfg()
	cfg.OpenKfIDs = []string{"kf"}
	r := newRig(t, cfg, nil, src)
	if err := r.s.Trigger("other", "tok"); !errors.Is(err, ErrUnknownOpenKfID) {
		t.Fatalf("Trigger(other) = %v, want ErrUnknownOpenKfID", err)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(r.s.idle(), "idle") })
	if other.Load() != 0 {
		t.Fatal("synced an open_kfid that is not configured")
	}
	if v := testenv.MetricValue(r.s.m.triggers.WithLabelValues("unknown_open_kfid")); v != 1 {
		t.Fatalf("unknown_open_kfid triggers = %v", v)
	}
}

// kf-producer starts the Syncer only once its Kafka producer is warm:
// triggers received before Start wait in the queue and are served after
// it.
func TestTriggerBeforeStart(t *testing.T) {
	src := &pageSource{}
	src.set("kf", "", SyncResponse{NextCursor: "c1", MsgList: msgs("kf", "a", 1)})
	st := newMemStore()
	s, err := NewSyncer(unitCfg(), SyncerDeps{Source: src, Locker: &fakeLocker{s: st}, State: st, Publisher: &recPublisher{},
		IDs: &seqIDs{}}, WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Trigger("kf", ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(src.requests()); n != 0 {
		t.Fatalf("%d sync_msg calls before Start", n)
	}
	s.Start()
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(s.idle(), "the queued trigger served after Start") })
	if c := st.cursor("kf"); c != "c1" {
		t.Fatalf("cursor = %q, want c1", c)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

}
