package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/obs"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func (f *fixture) verdict(t *testing.T, query string) Verdict {
	t.Helper()
	r := f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/verdict"+query, "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /admin/verdict%s: %d %s", query, r.status, r.body)
	}
	var v Verdict
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v Verdict) area(t *testing.T, name string) AreaVerdict {
	t.Helper()
	for _, a := range v.Areas {
		if a.Area == name {
			return a
		}
	}
	t.Fatalf("no area %s in %+v", name, v.Areas)
	return AreaVerdict{}
}

// bound is the value of alert's row in obs.Thresholds: the test drives
// the values past the rules' own bounds, whatever they are.
func bound(t *testing.T, alert string) int {
	t.Helper()
	for _, th := range obs.Thresholds {
		if th.Alert == alert {
			return int(th.Value)
		}
	}
	t.Fatalf("no threshold %s", alert)
	return 0
}

// addLetters puts n dead letters into the fake index, failed at t0-ago.
func (f *fixture) addLetters(n int, state string, ago time.Duration) {
	f.dlq.mu.Lock()
	defer f.dlq.mu.Unlock()
	for i := range n {
		f.dlq.msgs = append(f.dlq.msgs, &DLQMessage{ID: fmt.Sprintf("x-%s-%d", state, i), User: "flood", Reason: "handler_error",
			State: state, FailureTime: t0.Add(-ago)})
	}
}

// TestVerdictTurnsAmberAndRed drives the consumer lag and the DLQ inflow
// past the alert rules' bounds (obs.Thresholds, which deploy's
// TestAlertThresholdsMatchTable holds equal to alerts.yaml): each area
// turns amber at the warning rule's bound, red at the critical one's, and
// the verdict is its worst area.
func TestVerdictTurnsAmberAndRed(t *testing.T) {
	p := &memPipeline{
		accounts:  []AccountSync{{OpenKfID: "wk1", Reported: t0}},
		consumers: []ConsumerStatus{{Node: "c1", Partitions: 4, Reported: t0}},
	}
	f := newFixtureWith(t, p)
	v := f.verdict(t, "")
	for _, area := range []string{obs.AreaIngestion, obs.AreaLag, obs.AreaDLQ, obs.AreaRedis, obs.AreaDownstream} {
		if a := v.area(t, area); a.State != StateGreen {
			t.Errorf("quiet pipeline: %s is %s (%s), want green", area, a.State, a.Detail)
		}
	}
	if v.State != StateGreen {
		t.Fatalf("quiet pipeline: verdict %s", v.State)
	}

	lagAt := func(n int) {
		p.setLag([]PartitionLag{{Partition: 0, End: int64(n), Committed: 0, Lag: int64(n / 2)},
			{Partition: 1, End: int64(n - n/2), Committed: 0, Lag: int64(n - n/2)}}, nil)
	}
	high, critical := bound(t, "KfpipeConsumerLagHigh"), bound(t, "KfpipeConsumerLagCritical")
	for _, c := range []struct {
		lag   int
		state string
	}{{high, StateGreen}, {high + 1, StateAmber}, {critical, StateAmber}, {critical + 1, StateRed}} {
		lagAt(c.lag)
		v = f.verdict(t, "")
		a := v.area(t, obs.AreaLag)
		if a.State != c.state || v.State != c.state {
			t.Errorf("lag %d: area %s, verdict %s, want %s (%s)", c.lag, a.State, v.State, c.state, a.Detail)
		}
		if c.state == StateRed && !slices.Contains(a.Firing, "KfpipeConsumerLagCritical") {
			t.Errorf("lag %d: firing %v, want KfpipeConsumerLagCritical", c.lag, a.Firing)
		}
	}
	lagAt(0)

	// The DLQ: the sample letters count as they are.
	growth := bound(t, "KfpipeDLQGrowthHigh")
	had := f.verdict(t, "").area(t, obs.AreaDLQ).Values
	f.addLetters(growth-int(had["KfpipeDLQGrowthHigh"]), "retried", 10*time.Minute)
	if a := f.verdict(t, "").area(t, obs.AreaDLQ); a.State != StateGreen || a.Values["KfpipeDLQGrowthHigh"] != float64(growth) {
		t.Errorf("%d letters in the hour: %s %v, want green at the bound", growth, a.State, a.Values)
	}
	f.addLetters(1, "retried", 30*time.Minute)
	f.addLetters(50, "retried", 2*time.Hour) // older than the hour: not counted
	v = f.verdict(t, "")
	if a := v.area(t, obs.AreaDLQ); a.State != StateAmber || !slices.Contains(a.Firing, "KfpipeDLQGrowthHigh") || v.State != StateAmber {
		t.Errorf("%d letters in the hour: area %s firing %v verdict %s, want amber by KfpipeDLQGrowthHigh", growth+1, a.State, a.Firing, v.State)
	}
	review := bound(t, "KfpipeDLQManualReviewBacklog")
	f.addLetters(review+1-int(had["KfpipeDLQManualReviewBacklog"]), "review", 3*time.Hour)
	v = f.verdict(t, "")
	if a := v.area(t, obs.AreaDLQ); a.State != StateRed || !slices.Contains(a.Firing, "KfpipeDLQManualReviewBacklog") || v.State != StateRed {
		t.Errorf("%d in review: area %s firing %v verdict %s, want red", review+1, a.State, a.Firing, v.State)
	}
	// Each bound is shown with its rule's hold time.
	for _, b := range v.area(t, obs.AreaLag).Bounds {
		if b.Alert == "KfpipeConsumerLagHigh" && (b.ForSeconds != 300 || b.State != StateAmber) {
			t.Errorf("bound %+v, want 300 s amber", b)
		}
	}
}

// TestVerdictIngestionAndDownstream: an account waiting past the horizon
// warning is amber, past the critical one red; a consumer with its
// downstream gate open is red; a stale account is unknown.
func TestVerdictIngestionAndDownstream(t *testing.T) {
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	p := &memPipeline{
		accounts: []AccountSync{{OpenKfID: "wk-ok", Reported: t0},
			{OpenKfID: "wk-warn", OldestWaiting: at(-25 * time.Hour), Reported: t0}},
		consumers: []ConsumerStatus{{Node: "c1", Reported: t0}, {Node: "c2", Reported: t0, OutageGateOpen: true}},
	}
	f := newFixtureWith(t, p)
	v := f.verdict(t, "")
	if a := v.area(t, obs.AreaIngestion); a.State != StateAmber || len(a.Items) != 2 || a.Items[1].State != StateAmber || a.Items[0].State != StateGreen {
		t.Errorf("ingestion: %+v, want amber with wk-warn amber", a)
	}
	if a := v.area(t, obs.AreaDownstream); a.State != StateRed || !slices.Contains(a.Firing, "KfpipeDownstreamOutage") {
		t.Errorf("downstream: %+v, want red by KfpipeDownstreamOutage", a)
	}
	p.accounts = append(p.accounts, AccountSync{OpenKfID: "wk-crit", OldestWaiting: at(-49 * time.Hour), Reported: t0},
		AccountSync{OpenKfID: "wk-stale", Reported: t0.Add(-5 * time.Minute)})
	v = f.verdict(t, "")
	a := v.area(t, obs.AreaIngestion)
	if a.State != StateRed || a.Items[2].State != StateRed || a.Items[3].State != StateUnknown {
		t.Errorf("ingestion: %+v, want red, wk-crit red, wk-stale unknown", a)
	}
	if r := f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/verdict?hours=25", ""); r.status != http.StatusBadRequest {
		t.Errorf("hours=25: %d %s, want 400", r.status, r.body)
	}
}

// TestVerdictHistory: a sample a minute gives the lag, the throughput in
// and out (differences of the offsets) and the minute's dead letters; the
// span asked for bounds the points.
func TestVerdictHistory(t *testing.T) {
	p := &memPipeline{}
	f := newFixtureWith(t, p)
	ctx := context.Background()
	base := t0.Add(-10 * time.Minute)
	for i := range 10 {
		n := int64(i)
		p.setLag([]PartitionLag{{Partition: 0, End: 600 * n, Committed: 540 * n, Lag: 60 * n}}, nil)
		if err := f.srv.watch.sampleHistory(ctx, base.Add(time.Duration(i)*time.Minute+time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	v := f.verdict(t, "")
	if len(v.History.Points) != 10 {
		t.Fatalf("%d points, want 10: %+v", len(v.History.Points), v.History.Points)
	}
	pt := v.History.Points[5]
	if pt.Lag == nil || *pt.Lag != 300 || pt.InPerSecond == nil || *pt.InPerSecond != 10 || *pt.OutPerSecond != 9 {
		t.Errorf("point 5: %+v, want lag 300, 10/s in, 9/s out", pt)
	}
	if v.History.Points[0].InPerSecond != nil {
		t.Errorf("first point has a rate without a sample before it")
	}
	// The sample letters failed at t0 - 0..3 min: the minute before t0-1m.
	var dlq int64
	for _, p := range v.History.Points {
		if p.DLQ != nil {
			dlq += *p.DLQ
		}
	}
	if dlq == 0 {
		t.Errorf("no dead letters in the history's minutes")
	}
}

// TestHistoryBounded: 26 hours of samples leave 24 hours (1,441 members)
// in Redis, a sample of the same minute replaces the one there, and the
// set stays under 256 KB (about 145 B a sample).
func TestHistoryBounded(t *testing.T) {
	p := &memPipeline{lag: []PartitionLag{{Partition: 0, End: 123456789, Committed: 123456000, Lag: 789}}}
	f := newFixtureWith(t, p)
	ctx := context.Background()
	start := t0.Add(time.Hour)
	for i := range 26 * 60 {
		if err := f.srv.watch.sampleHistory(ctx, start.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	last := start.Add(26*60*time.Minute - time.Minute)
	if err := f.srv.watch.sampleHistory(ctx, last.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	key := historyKey(f.prefix)
	n, err := f.rdb.ZCard(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(historyKeep/historyStep)+1 {
		t.Errorf("%d samples kept, want %d", n, historyKeep/historyStep+1)
	}
	mem, err := f.rdb.MemoryUsage(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history: %d samples, %d bytes of Redis", n, mem)
	if mem > 256<<10 {
		t.Errorf("history takes %d bytes, want under 256 KB", mem)
	}
	if ttl := f.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > historyKeep+historyStep {
		t.Errorf("history TTL %s", ttl)
	}
}

// TestOverviewHorizonIsTheTable: the overview's account states (ok,
// warning, critical) use the same bounds as the verdict and the alert
// rules.
func TestOverviewHorizonIsTheTable(t *testing.T) {
	if got, want := horizonWarning, time.Duration(bound(t, "KfpipeWeChatHorizonWarning"))*time.Second; got != want {
		t.Errorf("overview's horizon warning %s, the table's %s", got, want)
	}
	if got, want := horizonCritical, time.Duration(bound(t, "KfpipeWeChatHorizonCritical"))*time.Second; got != want {
		t.Errorf("overview's horizon critical %s, the table's %s", got, want)
	}
}

// TestVerdictSinceAndClearsBy: the verdict says since when it is amber
// (recorded once, the same on every read), and an amber DLQ area whose
// letters stopped coming says when the last came and when it clears,
// rather than staying amber for an hour with nothing saying why.
func TestVerdictSinceAndClearsBy(t *testing.T) {
	p := &memPipeline{
		accounts:  []AccountSync{{OpenKfID: "wk1", Reported: t0}},
		consumers: []ConsumerStatus{{Node: "c1", Partitions: 4, Reported: t0}},
	}
	rdb, prefix := testenv.Redis(t)
	f := &fixture{dlq: newMemDLQ(t0), rl: newMemRL(t0), rdb: rdb, prefix: prefix}
	f.start(t, Config{Pipeline: p})
	clock := f.srv.clock.(*testenv.Clock)
	v := f.verdict(t, "")
	if v.State != StateGreen || v.Since == nil || !v.Since.Equal(t0) {
		t.Fatalf("quiet pipeline: %s since %v, want green since %v", v.State, v.Since, t0)
	}
	growth := bound(t, "KfpipeDLQGrowthHigh")
	had := int(v.area(t, obs.AreaDLQ).Values["KfpipeDLQGrowthHigh"])
	// A burst 40 minutes ago of bound+1 letters, none since.
	f.addLetters(growth+1-had, "retried", 40*time.Minute)
	clock.Advance(time.Minute)
	v = f.verdict(t, "")
	a := v.area(t, obs.AreaDLQ)
	if v.State != StateAmber || a.State != StateAmber || v.Since == nil || !v.Since.Equal(t0.Add(time.Minute)) || !a.Since.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after the burst: verdict %s since %v, area %s since %v, want amber since %v", v.State, v.Since, a.State, a.Since, t0.Add(time.Minute))
	}
	// The burst's 5-minute bucket ended 35 minutes before now (+1 min);
	// the burst leaves the hour's window with its bucket, ~20 min on.
	if a.CauseLast == nil || a.ClearsBy == nil {
		t.Fatalf("amber DLQ area without cause_last/clears_by: %+v", a)
	}
	if got := t0.Add(time.Minute).Sub(*a.CauseLast); got < 35*time.Minute || got > 40*time.Minute {
		t.Errorf("cause_last %v is %v before now, want 35-40 min (the burst's bucket)", a.CauseLast, got)
	}
	if got := a.ClearsBy.Sub(t0.Add(time.Minute)); got < 15*time.Minute || got > 25*time.Minute {
		t.Errorf("clears_by %v is %v from now, want ~20 min (when the burst leaves the hour)", a.ClearsBy, got)
	}
	// Read again later: the same since (recorded, not now).
	clock.Advance(5 * time.Minute)
	if v2 := f.verdict(t, ""); v2.Since == nil || !v2.Since.Equal(*v.Since) {
		t.Errorf("second read: since %v, want %v", v2.Since, v.Since)
	}
	// Past the clearing time the area is green again, since then.
	clock.Advance(a.ClearsBy.Sub(clock.Now()) + 5*time.Minute)
	v = f.verdict(t, "")
	if a := v.area(t, obs.AreaDLQ); a.State != StateGreen || a.Since == nil || !a.Since.Equal(clock.Now().Truncate(time.Second)) {
		t.Errorf("past clears_by: area %s since %v (%s), want green since now", a.State, a.Since, a.Detail)
	}
}

// TestVerdictDownstreamSlow: a consumer whose messages wait for its
// handler limit shows "downstream slow" with its limit, calls in flight
// and latency; slowness alone is not an outage (no alert fires).
func TestVerdictDownstreamSlow(t *testing.T) {
	p := &memPipeline{consumers: []ConsumerStatus{{Node: "c1", Reported: t0},
		{Node: "c2", Reported: t0, HandlerLimit: 30, HandlerInFlight: 30, HandlerWaiting: 120, HandlerLatency: 2.1}}}
	f := newFixtureWith(t, p)
	a := f.verdict(t, "").area(t, obs.AreaDownstream)
	if len(a.Firing) != 0 || !strings.Contains(a.Detail, "downstream slow on 1") {
		t.Fatalf("downstream: %+v, want no alert and downstream slow on 1", a)
	}
	if d := a.Items[1].Detail; !strings.Contains(d, "downstream slow: 30 calls in flight (limit 30), 120 messages waiting, 2.1 s a call") {
		t.Fatalf("c2: %q", d)
	}
}

// TestVerdictRedisAreaOnEmbeddedRedis: the demo's and the simulator's
// embedded Redis (miniredis) answers PING but has no INFO memory section;
// its area is green with the reason, not unknown — an unknown area made
// the demo's whole verdict unknown.
func TestVerdictRedisAreaOnEmbeddedRedis(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := &watch{base: &base{rdb: rdb}}
	a := s.redisArea(context.Background())
	if a.State != StateGreen || !strings.Contains(a.Detail, "memory not reported") {
		t.Fatalf("redis area on miniredis: %s %q, want green, memory not reported", a.State, a.Detail)
	}
	mr.Close()
	if a := s.redisArea(context.Background()); a.State != StateRed {
		t.Fatalf("redis area with the server gone: %s %q, want red", a.State, a.Detail)
	}
}
