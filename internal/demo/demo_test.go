package demo

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/dlq"
)

// summaryRE is the contract of the report's last line.
var summaryRE = regexp.MustCompile(`^demo: in=(\d+) processed=(\d+) duplicates=(\d+) dlq=(\d+) recovered=(\d+) lost=(\d+) reordered=(\d+) replies=(\d+) replies_dup_prevented=(\d+) msgs_per_sec=([0-9.]+) p99_ms=([0-9.]+)$`)

// TestShortDemoEmbedded runs the short scenario end to end on the
// embedded backends (the demo's own mode, not a stand-in for the real
// services of the integration tests) and checks the report's last line.
func TestShortDemoEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline for ~20 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Options{Scenario: ShortScenario(), Seed: 7, Out: &out, DrainTimeout: 45 * time.Second})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	t.Logf("report:\n%s", out.String())

	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	m := summaryRE.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last line %q does not match %s", lines[len(lines)-1], summaryRE)
	}
	get := func(i int) float64 {
		v, err := strconv.ParseFloat(m[i], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	in, processed, dups, dlq, recovered, lost, reordered := get(1), get(2), get(3), get(4), get(5), get(6), get(7)
	replies, prevented := get(8), get(9)
	_ = recovered // the outage no longer feeds the DLQ (the gate holds it); the bot's letters are due later
	checks := []struct {
		name string
		ok   bool
	}{
		{"in > 0", in > 0},
		{"processed > 0", processed > 0},
		{"lost = 0", lost == 0},
		{"reordered = 0", reordered == 0},
		{"dlq > 0 (the bot)", dlq > 0},
		{"duplicates > 0 (the re-delivery)", dups > 0},
		{"processed + held = in", int(processed)+rep.Parked == int(in)},
		{"no double effects", rep.DoubleEffects == 0},
		{"settled before the deadline", rep.Settled},
		{"admin console answered", rep.AdminUI == 200},
		{"admin DLQ stats answered", rep.AdminDLQStats == 200},
		{"admin shows the bot blocked", rep.AdminBotStatus == 200 && rep.BotBlocked},
		{"bot dead-lettered as user_blocked", rep.DLQRecords["user_blocked"] > 0},
		{"bot and excited user rate_limited", rep.DLQRecords["rate_limited"] > 0},
		// The outage fails the handler for every user: the downstream gate
		// holds their messages instead of dead-lettering them. At the
		// demo's low traffic the first one or two messages of the outage
		// may use up their attempts before a second user has failed (one
		// failing user is that user's problem): before the gate, every
		// message of the outage was dead-lettered (~15).
		{"outage held by the gate, not dead-lettered", rep.HandlerFailures > 0 && rep.GateTransitions >= 2 &&
			rep.DLQRecords["downstream_error"] <= 5},
		{"summary line is the report's", lines[len(lines)-1] == rep.Summary()},
		// One reply per processed message, each reaching WeChat once; the
		// handlers that failed after replying ran again without resending.
		{"a reply per processed message", int(replies)+rep.RepliesRefused == int(processed)},
		{"WeChat delivered each reply once", rep.RepliesAtWeChat == int(replies) && rep.ReplyMsgIDRepeats == 0},
		{"duplicate replies prevented", prevented > 0 && int(prevented) == rep.AfterReplyFailures},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: failed", c.name)
		}
	}
}

func TestScenarioBuild(t *testing.T) {
	s := ShortScenario()
	a, b := s.build(3), s.build(3)
	if len(a.msgs) != len(b.msgs) || len(a.events) != len(b.events) {
		t.Fatalf("same seed, different plans: %d/%d msgs", len(a.msgs), len(b.msgs))
	}
	want := s.Users*s.MsgsPerUser + 6 + s.BotRate*int(s.BotFor/time.Second) + s.CrowdUsers
	if len(a.msgs) != want {
		t.Errorf("msgs = %d, want %d", len(a.msgs), want)
	}
	// Events are in time order, and each user's messages are planned in
	// their own order (the order check relies on it).
	last := map[string]int{}
	redeliver := 0
	for i, e := range a.events {
		if i > 0 && e.at < a.events[i-1].at {
			t.Fatalf("event %d at %v before %v", i, e.at, a.events[i-1].at)
		}
		switch e.kind {
		case evMessage:
			m := a.msgs[e.ref]
			if prev, ok := last[m.user]; ok && m.userSeq != prev+1 {
				t.Fatalf("user %s: seq %d after %d", m.user, m.userSeq, prev)
			}
			last[m.user] = m.userSeq
		case evRedeliver:
			redeliver++
			if u := a.msgs[e.ref].user; u == botUser || u == excitedUser {
				t.Errorf("re-delivery of %s: only normal users' messages are re-delivered", u)
			}
		}
	}
	if redeliver != s.RedeliverN {
		t.Errorf("re-deliveries = %d, want %d", redeliver, s.RedeliverN)
	}
	// A normal user stays within 3 messages per 10 s window (see
	// Scenario.GapMin), leaving room for a duplicate and a recovery.
	times := map[string][]time.Duration{}
	for _, e := range a.events {
		if e.kind == evMessage && strings.HasPrefix(e.user, "demo-user-") {
			times[e.user] = append(times[e.user], e.at)
		}
	}
	for u, ts := range times {
		for i := 3; i < len(ts); i++ {
			if ts[i]-ts[i-3] < 10*time.Second {
				t.Fatalf("user %s: 4 messages within 10 s: %v", u, ts)
			}
		}
	}
}

func TestReportAccounting(t *testing.T) {
	p := &plan{msgs: []planned{
		{user: "u", id: "a", userSeq: 0}, {user: "u", id: "b", userSeq: 1}, {user: "u", id: "c", userSeq: 2},
		{user: "v", id: "d", userSeq: 0}, {user: "v", id: "e", userSeq: 1}, {user: "w", id: "f", userSeq: 0},
	}}
	later := time.Now().Add(time.Hour)
	tests := []struct {
		name string
		seqs map[string][]string
		dead map[string]string // msgid → state
		want Report
	}{
		{name: "all in order", seqs: map[string][]string{"u": {"a", "b", "c"}, "v": {"d", "e"}, "w": {"f"}},
			want: Report{In: 6, Processed: 6}},
		{name: "swap outside the DLQ", seqs: map[string][]string{"u": {"b", "a", "c"}, "v": {"d", "e"}, "w": {"f"}},
			want: Report{In: 6, Processed: 6, Reordered: 1}},
		{name: "recovered late via the DLQ", seqs: map[string][]string{"u": {"b", "c", "a"}, "v": {"d", "e"}, "w": {"f"}},
			dead: map[string]string{"a": "retried"},
			want: Report{In: 6, Processed: 6, DLQ: 1, Recovered: 1, RecoveredLate: 1}},
		{name: "held and lost", seqs: map[string][]string{"u": {"a", "b", "c"}, "v": {"d"}},
			dead: map[string]string{"e": "due"},
			want: Report{In: 6, Processed: 4, DLQ: 1, Parked: 1, Lost: 1}},
		{name: "retried but never processed is lost", seqs: map[string][]string{"u": {"a", "b", "c"}, "v": {"d", "e"}},
			dead: map[string]string{"f": "retried"},
			want: Report{In: 6, Processed: 5, DLQ: 1, Lost: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := recorded{seqs: tc.seqs, handled: map[string]int{}, latency: map[string]time.Duration{}}
			for _, ids := range tc.seqs {
				for _, id := range ids {
					rec.handled[id]++
				}
			}
			v := dlqView{byMsg: map[string][]*dlq.Entry{}, byReason: map[string]int{}}
			for id, st := range tc.dead {
				v.byMsg[id] = append(v.byMsg[id], testEntry(id, st, later))
			}
			var r Report
			r.account(p, rec, v, time.Now(), time.Now())
			got := Report{In: r.In, Processed: r.Processed, DLQ: r.DLQ, Recovered: r.Recovered, Parked: r.Parked,
				Lost: r.Lost, Reordered: r.Reordered, RecoveredLate: r.RecoveredLate}
			if got.In != tc.want.In || got.Processed != tc.want.Processed || got.DLQ != tc.want.DLQ ||
				got.Recovered != tc.want.Recovered || got.Parked != tc.want.Parked || got.Lost != tc.want.Lost ||
				got.Reordered != tc.want.Reordered || got.RecoveredLate != tc.want.RecoveredLate {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func testEntry(id, state string, next time.Time) *dlq.Entry {
	return &dlq.Entry{DeadLetterMessage: &dlq.DeadLetterMessage{UpstreamMsgID: id, Reason: dlq.ReasonDownstreamError,
		NextRetryTime: &next}, State: state}
}
