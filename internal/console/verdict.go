package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/obs"
)

// The health verdict: each area green, amber or red by the alert rules'
// own bounds (obs.Thresholds, checked against deploy/prometheus/alerts.yaml),
// so the console and the pager never disagree about what is bad. The
// verdict grades the values now; a rule also waits its hold time (For)
// before it fires, which the answer states beside each bound.

// Verdict states, worst last.
const (
	StateGreen   = "green"
	StateUnknown = "unknown"
	StateAmber   = "amber"
	StateRed     = "red"
)

var stateRank = map[string]int{StateGreen: 0, StateUnknown: 1, StateAmber: 2, StateRed: 3}

func worse(a, b string) string {
	if stateRank[b] > stateRank[a] {
		return b
	}
	return a
}

func colourOf(severity string) string {
	if severity == obs.SeverityCritical {
		return StateRed
	}
	return StateAmber
}

// BoundView is one alert rule's bound as the verdict shows it.
type BoundView struct {
	Alert      string  `json:"alert"`
	State      string  `json:"state"` // the colour when passed
	Value      float64 `json:"value"`
	Equal      bool    `json:"equal,omitempty"`
	ForSeconds int64   `json:"for_seconds"`
	What       string  `json:"what"`
}

// AreaItem is one graded part of an area (an account of the ingestion).
type AreaItem struct {
	Name   string  `json:"name"`
	State  string  `json:"state"`
	Value  float64 `json:"value"`
	Detail string  `json:"detail"`
}

// AreaVerdict is one area's colour and why.
type AreaVerdict struct {
	Area  string `json:"area"`
	State string `json:"state"`
	// Values are the graded values by alert rule.
	Values map[string]float64 `json:"values"`
	// Firing names the rules whose bound the values pass now.
	Firing []string    `json:"firing"`
	Detail string      `json:"detail"`
	Bounds []BoundView `json:"bounds"`
	Items  []AreaItem  `json:"items,omitempty"`
	// Since is when the area last changed to State (as first seen by a
	// console; absent when it could not be recorded).
	Since *time.Time `json:"since,omitempty"`
	// ClearsBy, for an area graded over a window that passes its bound
	// now, is when it turns green again if nothing more happens; CauseLast
	// is when its cause was last seen.
	ClearsBy  *time.Time `json:"clears_by,omitempty"`
	CauseLast *time.Time `json:"cause_last,omitempty"`
}

// Verdict is the answer of GET /admin/verdict.
type Verdict struct {
	Time  time.Time `json:"time"`
	State string    `json:"state"`
	// Since is when the verdict last changed to State.
	Since   *time.Time    `json:"since,omitempty"`
	Areas   []AreaVerdict `json:"areas"`
	History HistoryView   `json:"history"`
	// HistoryError says why the history could not be read.
	HistoryError string `json:"history_error,omitempty"`
}

func boundsOf(area string) []BoundView {
	var out []BoundView
	for _, t := range obs.ThresholdsOf(area) {
		out = append(out, BoundView{Alert: t.Alert, State: colourOf(t.Severity), Value: t.Value, Equal: t.Equal,
			ForSeconds: int64(t.For / time.Second), What: t.What})
	}
	return out
}

// gradeArea grades values (by alert name) against area's bounds; a row
// without a value is not graded.
func gradeArea(area string, values map[string]float64) AreaVerdict {
	a := AreaVerdict{Area: area, State: StateGreen, Values: values, Firing: []string{}, Bounds: boundsOf(area)}
	for _, t := range obs.ThresholdsOf(area) {
		if v, ok := values[t.Alert]; ok && t.Exceeded(v) {
			a.State = worse(a.State, colourOf(t.Severity))
			a.Firing = append(a.Firing, t.Alert)
		}
	}
	return a
}

func unknownArea(area, why string) AreaVerdict {
	return AreaVerdict{Area: area, State: StateUnknown, Values: map[string]float64{}, Firing: []string{},
		Detail: why, Bounds: boundsOf(area)}
}

// verdict reads each area and grades it; an area that cannot be read is
// unknown with the error as its detail.
func (s *watch) verdict(ctx context.Context, now time.Time) Verdict {
	v := Verdict{Time: now}
	v.Areas = append(v.Areas, s.ingestionArea(ctx, now), s.lagArea(ctx, now), s.dlqArea(ctx, now),
		s.redisArea(ctx), s.downstreamArea(ctx, now))
	v.State = StateGreen
	for _, a := range v.Areas {
		v.State = worse(v.State, a.State)
	}
	s.recordSince(ctx, now, &v)
	return v
}

// verdictSinceKey is the hash of each area's (and the verdict's, field
// "verdict") state and when it changed to it: "state|unix seconds".
func verdictSinceKey(prefix string) string { return prefix + "verdict:since" }

// recordSince fills the verdict's and each area's Since from Redis, and
// records a change: an on-call person reads "amber since 14:02", not only
// "amber". The first console to see a change records it; every replica
// answers the same time. A Redis error leaves Since absent.
func (s *watch) recordSince(ctx context.Context, now time.Time, v *Verdict) {
	key := verdictSinceKey(s.cfg.Prefix)
	seen, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return
	}
	changed := map[string]any{}
	since := func(field, state string) *time.Time {
		if prev, at, ok := strings.Cut(seen[field], "|"); ok && prev == state {
			if sec, err := strconv.ParseInt(at, 10, 64); err == nil {
				t := time.Unix(sec, 0).UTC()
				return &t
			}
		}
		changed[field] = state + "|" + strconv.FormatInt(now.Unix(), 10)
		t := now.Truncate(time.Second)
		return &t
	}
	v.Since = since("verdict", v.State)
	for i := range v.Areas {
		v.Areas[i].Since = since(v.Areas[i].Area, v.Areas[i].State)
	}
	if len(changed) > 0 {
		_ = s.rdb.HSet(ctx, key, changed).Err()
	}
}

const noPipeline = "not available: the admin API was started without the pipeline's view"

func (s *watch) ingestionArea(ctx context.Context, now time.Time) AreaVerdict {
	p := s.cfg.Pipeline
	if p == nil {
		return unknownArea(obs.AreaIngestion, noPipeline)
	}
	accts, err := p.Accounts(ctx)
	if err != nil {
		return unknownArea(obs.AreaIngestion, err.Error())
	}
	a := gradeArea(obs.AreaIngestion, map[string]float64{})
	var worst float64
	stale := 0
	for _, ac := range accts {
		var waited float64
		if ac.OldestWaiting != nil {
			waited = now.Sub(*ac.OldestWaiting).Seconds()
		}
		g := gradeArea(obs.AreaIngestion, valuesFor(obs.AreaIngestion, waited))
		it := AreaItem{Name: ac.OpenKfID, State: g.State, Value: waited,
			Detail: fmt.Sprintf("oldest waiting %s", (time.Duration(waited) * time.Second).Round(time.Second))}
		if ac.OldestWaiting == nil {
			it.Detail = "nothing waits in WeChat"
		}
		if g.State == StateGreen && now.Sub(ac.Reported) > statusStale {
			it.State, it.Detail = StateUnknown, "no status from kf-producer for "+now.Sub(ac.Reported).Round(time.Second).String()
			stale++
		}
		a.Items = append(a.Items, it)
		a.State = worse(a.State, it.State)
		for _, f := range g.Firing {
			if !strings.Contains(strings.Join(a.Firing, ","), f) {
				a.Firing = append(a.Firing, f)
			}
		}
		worst = max(worst, waited)
	}
	a.Values = valuesFor(obs.AreaIngestion, worst)
	a.Detail = fmt.Sprintf("%d account(s); the oldest message waiting in WeChat: %s", len(accts),
		(time.Duration(worst) * time.Second).Round(time.Second))
	if stale > 0 {
		a.Detail += fmt.Sprintf("; %d account(s) without a fresh status", stale)
	}
	if len(accts) == 0 {
		a.State, a.Detail = StateUnknown, "kf-producer published no account status"
	}
	return a
}

// valuesFor gives v to every bound of area (the bounds that grade one
// value).
func valuesFor(area string, v float64) map[string]float64 {
	out := map[string]float64{}
	for _, t := range obs.ThresholdsOf(area) {
		out[t.Alert] = v
	}
	return out
}

func (s *watch) lagArea(ctx context.Context, now time.Time) AreaVerdict {
	p := s.cfg.Pipeline
	if p == nil {
		return unknownArea(obs.AreaLag, noPipeline)
	}
	lag, err := p.Lag(ctx)
	if err != nil {
		return unknownArea(obs.AreaLag, err.Error())
	}
	var total int64
	for _, pl := range lag {
		total += pl.Lag
	}
	a := gradeArea(obs.AreaLag, valuesFor(obs.AreaLag, float64(total)))
	a.Detail = fmt.Sprintf("%d message(s) behind over %d partition(s)", total, len(lag))
	return a
}

func (s *watch) dlqArea(ctx context.Context, now time.Time) AreaVerdict {
	st, err := s.dlq.Stats(ctx)
	if err != nil {
		return unknownArea(obs.AreaDLQ, err.Error())
	}
	in, err := s.dlq.Inflow(ctx, now, inflowStep, inflowBuckets)
	if err != nil {
		return unknownArea(obs.AreaDLQ, err.Error())
	}
	var hour int64
	for _, counts := range in {
		for _, c := range counts {
			hour += c
		}
	}
	a := gradeArea(obs.AreaDLQ, map[string]float64{"KfpipeDLQGrowthHigh": float64(hour),
		"KfpipeDLQManualReviewBacklog": float64(st.Review)})
	a.Detail = fmt.Sprintf("%d dead letter(s) in the last hour; %d wait for manual review", hour, st.Review)
	if slices.Contains(a.Firing, "KfpipeDLQGrowthHigh") {
		a.CauseLast, a.ClearsBy = growthClears(in, now)
		if a.CauseLast != nil && a.ClearsBy != nil {
			a.Detail += fmt.Sprintf("; the last came by %s; with no more, the hour's count falls under the bound by %s",
				a.CauseLast.Format("15:04"), a.ClearsBy.Format("15:04"))
		}
	}
	return a
}

// growthClears reads the hour's inflow (inflowBuckets of inflowStep,
// oldest first, ending at now) for when the last dead letter came (the end
// of the newest bucket that holds one) and when the hour's count, with no
// more letters, falls to the KfpipeDLQGrowthHigh bound as the old buckets
// leave the window. An amber that stays an hour after its cause stopped is
// the window, not a live problem: this says so, and until when.
func growthClears(in map[string][]int64, now time.Time) (last, clears *time.Time) {
	buckets := make([]int64, inflowBuckets)
	for _, counts := range in {
		for i, c := range counts {
			if i < len(buckets) {
				buckets[i] += c
			}
		}
	}
	from := now.Add(-inflowBuckets * inflowStep)
	for i := len(buckets) - 1; i >= 0; i-- {
		if buckets[i] > 0 {
			t := from.Add(time.Duration(i+1) * inflowStep)
			if t.After(now) {
				t = now
			}
			last = &t
			break
		}
	}
	var bound obs.Threshold
	for _, t := range obs.ThresholdsOf(obs.AreaDLQ) {
		if t.Alert == "KfpipeDLQGrowthHigh" {
			bound = t
		}
	}
	var rest int64
	for _, c := range buckets {
		rest += c
	}
	for k := 0; k <= len(buckets); k++ {
		if !bound.Exceeded(float64(rest)) {
			t := now.Add(time.Duration(k) * inflowStep)
			clears = &t
			break
		}
		if k < len(buckets) {
			rest -= buckets[k]
		}
	}
	return last, clears
}

// redisArea pings Redis and reads its memory: its rule
// (KfpipeRedisOutOfMemory) fires on refused writes, which happen at
// maxmemory, so used memory at maxmemory is red.
func (s *watch) redisArea(ctx context.Context) AreaVerdict {
	a := AreaVerdict{Area: obs.AreaRedis, State: StateGreen, Values: map[string]float64{}, Firing: []string{},
		Bounds: []BoundView{{Alert: "KfpipeRedisOutOfMemory", State: StateRed, What: "used memory at maxmemory (writes refused)"}}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		a.State, a.Detail = StateRed, "unreachable: "+err.Error()
		return a
	}
	rtt := time.Since(start)
	info, err := s.rdb.Info(ctx, "memory").Result()
	if err != nil && strings.Contains(err.Error(), "not supported") {
		// The demo's and the simulator's embedded Redis (miniredis)
		// keeps no memory section: it answers, and has no maxmemory to
		// reach, so it is not a reason for an unknown verdict.
		a.Detail = fmt.Sprintf("PING %s; memory not reported (an embedded Redis: %v)", rtt.Round(time.Microsecond), err)
		return a
	}
	if err != nil {
		a.State, a.Detail = StateUnknown, "INFO memory: "+err.Error()
		return a
	}
	used, maxm := infoInt(info, "used_memory"), infoInt(info, "maxmemory")
	a.Values["used_memory"], a.Values["maxmemory"] = float64(used), float64(maxm)
	a.Detail = fmt.Sprintf("PING %s; %s used", rtt.Round(time.Microsecond), bytesText(used))
	if maxm > 0 {
		a.Detail += fmt.Sprintf(" of maxmemory %s (%.0f%%)", bytesText(maxm), 100*float64(used)/float64(maxm))
		if used >= maxm {
			a.State = StateRed
			a.Firing = append(a.Firing, "KfpipeRedisOutOfMemory")
		}
	} else {
		a.Detail += " (no maxmemory)"
	}
	return a
}

func infoInt(info, key string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
}

func (s *watch) downstreamArea(ctx context.Context, now time.Time) AreaVerdict {
	p := s.cfg.Pipeline
	if p == nil {
		return unknownArea(obs.AreaDownstream, noPipeline)
	}
	cs, err := p.Consumers(ctx)
	if err != nil {
		return unknownArea(obs.AreaDownstream, err.Error())
	}
	open, live, slow := 0, 0, 0
	a := gradeArea(obs.AreaDownstream, map[string]float64{})
	for _, c := range cs {
		if fleet.Judge(c.Reported, now) != fleet.Live {
			continue
		}
		live++
		gate := 0.0
		if c.OutageGateOpen {
			gate, open = 1, open+1
		}
		g := gradeArea(obs.AreaDownstream, valuesFor(obs.AreaDownstream, gate))
		detail := "gate closed: the handler's downstream answers"
		switch {
		case c.OutageGateOpen:
			detail = "gate open: messages wait for the downstream"
		case c.HandlerWaiting > 0:
			// Not a failure: the consumer calls the downstream no faster
			// than it answers, and the lag grows (docs/operations.md, "A
			// slow downstream").
			slow++
			detail = fmt.Sprintf("downstream slow: %d calls in flight (limit %d), %d messages waiting, %.1f s a call",
				c.HandlerInFlight, c.HandlerLimit, c.HandlerWaiting, c.HandlerLatency)
		}
		a.Items = append(a.Items, AreaItem{Name: c.Node, State: g.State, Value: gate, Detail: detail})
		a.State = worse(a.State, g.State)
		if len(g.Firing) > 0 && len(a.Firing) == 0 {
			a.Firing = g.Firing
		}
	}
	a.Values = valuesFor(obs.AreaDownstream, float64(min(open, 1)))
	a.Detail = fmt.Sprintf("%d of %d live schedule-consumer(s) hold messages for the downstream", open, live)
	if slow > 0 {
		a.Detail += fmt.Sprintf("; downstream slow on %d (messages wait for the handler limit, the lag grows)", slow)
	}
	if live == 0 {
		a.State, a.Detail = StateUnknown, "no live schedule-consumer reports its gate"
	}
	return a
}

// getVerdict answers GET /admin/verdict[?hours=1..24]: the areas' colours
// and the history of the last hours.
func (s *watch) getVerdict(w http.ResponseWriter, r *http.Request) {
	hours := 1
	if h := r.URL.Query().Get("hours"); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || n < 1 || n > int(historyKeep/time.Hour) {
			writeError(w, badRequest("hours", fmt.Sprintf("hours must be a whole number in [1, %d], got %q", int(historyKeep/time.Hour), h)))
			return
		}
		hours = n
	}
	now := s.clock.Now().UTC()
	v := s.verdict(r.Context(), now)
	var err error
	if v.History, err = s.readHistory(r.Context(), now, time.Duration(hours)*time.Hour); err != nil {
		v.HistoryError = err.Error()
	}
	writeJSON(w, http.StatusOK, v)
}
