package demo

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/testenv"
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
	failing, excited, bot := rep.Profile("failing"), rep.Profile("excited"), rep.Profile("bot")
	outageLetters := rep.DLQRecords["downstream_error"] - failing.Downstream
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
		{"bot limited and blocked", bot.RateLimited > 0 && bot.Blocked > 0 && bot.BlockedUsers == 1},
		// Recovery: the failing downstream's messages were dead-lettered
		// and, after the fix, every one came back through the scheduler,
		// each user's in order, with nobody limited or blocked on the way.
		// The limiter must not judge a recovered letter as new traffic:
		// when it did (issue 29), the letters came back into the
		// window of their send time and were refused, their users blocked.
		{"recovered > 0 on the last line", recovered > 0},
		{"failing users dead-lettered as downstream_error", failing.In > 0 && failing.Downstream > 0 && failing.DLQ > 0},
		{"every failing user's letter recovered", failing.Recovered == failing.DLQ && failing.Processed == failing.In},
		{"recovered letters in order per user", rep.RecoveredOutOfOrder == 0},
		{"nobody limited by a recovery", len(rep.RefusedOnRecovery) == 0 && rep.RecoveryRefused == 0 && failing.Limited == 0},
		{"nobody blocked by a recovery", len(rep.BlockedByRecovery) == 0 && failing.BlockedUsers == 0},
		{"recovery timed from the fix", rep.FixToFirst > 0 && rep.FixToLast >= rep.FixToFirst},
		// A human's burst (12 messages in 2 s, twice) is neither limited
		// nor blocked by the shipped rules, while the bot is (the seed's
		// rule, 5 per 10 s and 3 refusals, blocks both).
		{"excited customer not limited", excited.In == 24 && excited.Limited == 0 && excited.DLQ == 0 && excited.Processed == excited.In},
		{"excited customer not blocked", excited.BlockedUsers == 0},
		{"only the bot blocked", len(rep.BlockedUsers) == 1},
		// The latency explained: the messages that waited on the outage
		// and the others, both reported.
		{"latency split around the outage", rep.Outage.N > 0 && rep.Calm.N > 0 && rep.Calm.N+rep.Outage.N > 0 &&
			rep.Outage.Max >= rep.Outage.P50},
		{"the p99's messages attributed to their classes", len(rep.AtP99) > 0},
		// The outage fails the handler for every user: the downstream gate
		// holds their messages instead of dead-lettering them. At the
		// demo's low traffic the first one or two messages of the outage
		// may use up their attempts before a second user has failed (one
		// failing user is that user's problem): before the gate, every
		// message of the outage was dead-lettered (~15).
		{"outage held by the gate, not dead-lettered", rep.HandlerFailures > 0 && rep.GateTransitions >= 2 &&
			outageLetters <= 5},
		{"summary line is the report's", lines[len(lines)-1] == rep.Summary()},
		// One reply per processed message, each reaching WeChat once; the
		// handlers that failed after replying ran again without resending.
		{"a reply per processed message", int(replies)+rep.RepliesRefused == int(processed)},
		{"WeChat delivered each reply once", rep.RepliesAtWeChat == int(replies) && rep.ReplyMsgIDRepeats == 0},
		// The photo went through kf-producer's media keeper to the media
		// store and the handler answered about it from there.
		{"the photo answered from the media store", rep.Photo.Answer != "" && rep.Photo.Bytes == rep.PhotoBytes &&
			rep.Photo.ContentType == "image/png" && strings.Contains(out.String(), "photo:                  a customer's")},
		{"duplicate replies prevented", prevented > 0 && int(prevented) == rep.AfterReplyFailures},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: failed", c.name)
		}
	}
}

func TestScenarioBuild(t *testing.T) {
	for name, s := range map[string]Scenario{"short": ShortScenario(), "full": FullScenario()} {
		t.Run(name, func(t *testing.T) { checkScenario(t, s) })
	}
}

func checkScenario(t *testing.T, s Scenario) {
	a, b := s.build(3), s.build(3)
	if len(a.msgs) != len(b.msgs) || len(a.events) != len(b.events) {
		t.Fatalf("same seed, different plans: %d/%d msgs", len(a.msgs), len(b.msgs))
	}
	excited := 0
	for _, b := range s.Excited {
		excited += b.N
		// A human's burst: a dozen messages within seconds.
		if b.N < 12 || (b.N-1)*int(b.gap()) > int(2*time.Second) {
			t.Errorf("excited burst %+v: want at least 12 messages within 2 s", b)
		}
	}
	if len(s.Excited) < 2 {
		t.Errorf("excited bursts = %d, want 2", len(s.Excited))
	}
	want := s.Users*s.MsgsPerUser + excited + s.FailUsers*s.FailMsgs + s.BotRate*int(s.BotFor/time.Second) + s.CrowdUsers
	if len(a.msgs) != want {
		t.Errorf("msgs = %d, want %d", len(a.msgs), want)
	}
	// The failing downstream is fixed before its first letter can come
	// due, and its users' messages are all sent while it fails.
	if s.FailFor >= recoveryBase {
		t.Errorf("FailFor %s >= recovery base %s: a letter would be retried into the failure", s.FailFor, recoveryBase)
	}
	for _, e := range a.events {
		if e.kind == evMessage && profileOf(e.user) == "failing" && (e.at < s.FailAt || e.at >= s.FailAt+s.FailFor) {
			t.Errorf("failing user %s sends at %s, outside the failure [%s, %s)", e.user, e.at, s.FailAt, s.FailAt+s.FailFor)
		}
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
			if u := a.msgs[e.ref].user; profileOf(u) != "normal" {
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
	return &dlq.Entry{DeadLetter: &chatmsg.DeadLetter{UpstreamMsgID: id, Reason: dlq.ReasonDownstreamError,
		NextRetryTime: &next}, State: state}
}

// TestReportRecovery checks the recovery figures on a made-up run: a
// failing user's letters recovered out of order and refused once by the
// limiter on the way back, a bot blocked, and the latency split around
// the outage.
func TestReportRecovery(t *testing.T) {
	f := failingUser(0)
	p := &plan{msgs: []planned{
		{user: f, id: "f1", userSeq: 0}, {user: f, id: "f2", userSeq: 1}, {user: f, id: "f3", userSeq: 2},
		{user: "demo-user-0001", id: "n1", userSeq: 0}, {user: "demo-user-0001", id: "n2", userSeq: 1},
		{user: botUser, id: "b1", userSeq: 0},
		{user: "demo-crowd-0001", id: "c1", userSeq: 0}, {user: "demo-user-0002", id: "n3", userSeq: 0},
	}}
	t0 := time.Now().Add(-time.Minute)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	rec := recorded{
		seqs: map[string][]string{f: {"f2", "f1", "f3"}, "demo-user-0001": {"n1", "n2"}, botUser: {"b1"},
			"demo-crowd-0001": {"c1"}, "demo-user-0002": {"n3"}},
		handled: map[string]int{"f1": 1, "f2": 1, "f3": 1, "n1": 1, "n2": 1, "b1": 1, "c1": 1, "n3": 1},
		latency: map[string]time.Duration{"n1": 10 * time.Millisecond, "n2": 3 * time.Second, "b1": 20 * time.Millisecond,
			"c1": time.Second, "n3": 500 * time.Millisecond},
		producedAt: map[string]time.Time{"n1": at(1), "n2": at(10), "b1": at(20), "c1": at(30), "n3": at(30.5)},
		handledAt: map[string]time.Time{"n1": at(1.01), "n2": at(13), "b1": at(20.02),
			"f1": at(8), "f2": at(7.5), "f3": at(9), "c1": at(31), "n3": at(31)},
		userOf: map[string]string{"n1": "demo-user-0001", "n2": "demo-user-0001", "b1": botUser,
			"c1": "demo-crowd-0001", "n3": "demo-user-0002"},
		outageAt: at(10), outageEndAt: at(11), outageClosedAt: at(13),
		failAt: at(2), fixedAt: at(6),
	}
	later := time.Now().Add(time.Hour)
	v := dlqView{byMsg: map[string][]*dlq.Entry{}, byReason: map[string]int{}}
	for _, id := range []string{"f1", "f2", "f3"} {
		v.byMsg[id] = append(v.byMsg[id], testEntry(id, "retried", later))
	}
	refused := testEntry("f3", "retried", later)
	refused.Reason = dlq.ReasonRateLimited
	v.byMsg["f3"] = append(v.byMsg["f3"], refused)
	var r Report
	r.account(p, rec, v, time.Now(), t0)
	r.blocks(map[string]time.Time{botUser: later})
	fp := r.Profile("failing")
	switch {
	case r.Recovered != 3 || fp.Recovered != 3 || fp.DLQ != 3:
		t.Errorf("recovered = %d (failing %d of %d), want 3 of 3", r.Recovered, fp.Recovered, fp.DLQ)
	case r.RecoveredOutOfOrder != 1:
		t.Errorf("recovered out of order = %d, want 1 (f1 after f2)", r.RecoveredOutOfOrder)
	case r.RecoveryRefused != 1 || len(r.RefusedOnRecovery) != 1 || r.RefusedOnRecovery[0] != f || fp.Limited != 1:
		t.Errorf("refused on recovery = %d %v (failing limited %d), want 1 [%s]", r.RecoveryRefused, r.RefusedOnRecovery, fp.Limited, f)
	case len(r.BlockedByRecovery) != 0 || r.Profile("bot").BlockedUsers != 1:
		t.Errorf("blocked by recovery %v, bot blocked users %d; want none and 1", r.BlockedByRecovery, r.Profile("bot").BlockedUsers)
	case r.FixToFirst != 1500*time.Millisecond || r.FixToLast != 3*time.Second:
		t.Errorf("fix → recovered %s..%s, want 1.5s..3s", r.FixToFirst, r.FixToLast)
	case r.Outage.N != 1 || r.Outage.Max != 3*time.Second || r.Calm.N != 2 || r.Calm.Max != 20*time.Millisecond:
		t.Errorf("latency split: outage %+v, calm %+v; want n2 waited, n1 and b1 did not", r.Outage, r.Calm)
	case r.Crowd.N != 2 || r.Crowd.Max != time.Second || r.CalmBy["normal"].N != 1 || r.CalmBy["bot"].N != 1:
		t.Errorf("latency split: crowd %+v, calm by profile %+v; want c1 and n3 with the crowd", r.Crowd, r.CalmBy)
	case r.AtP99["waited on the outage"] != 1 || len(r.AtP99) != 1:
		t.Errorf("at the p99 (%s): %v, want n2 (waited on the outage) alone", r.P99, r.AtP99)
	case r.GateHeldAfter != 2*time.Second:
		t.Errorf("gate held after = %s, want 2s", r.GateHeldAfter)
	}
	r.blocks(map[string]time.Time{botUser: later, f: later})
	if len(r.BlockedByRecovery) != 1 || r.BlockedByRecovery[0] != f {
		t.Errorf("blocked by recovery = %v, want [%s]", r.BlockedByRecovery, f)
	}
}

// TestShortDemoWithArchive runs the short scenario on the embedded Kafka
// and Redis with --archive on the test PostgreSQL (a schema of its own):
// every message of the scenario (the report's, which leaves out the
// warm-up and the photo) is archived once, every
// processed message has its outcome, every reply sent its row, and the
// excited customer's 24 messages are their conversation in the archive.
func TestShortDemoWithArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline for ~20 s")
	}
	dsn := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Options{Scenario: ShortScenario(), Seed: 7, Out: &out, DrainTimeout: 45 * time.Second, Archive: dsn})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if rep.Lost != 0 || rep.Reordered != 0 || !rep.Settled {
		t.Fatalf("the demo itself failed:\n%s", out.String())
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var msgs, msgids, outcomes, replies int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'message'), count(DISTINCT msgid) FILTER (WHERE kind = 'message'),
		count(DISTINCT msgid) FILTER (WHERE kind IN ('handled', 'recovered')), count(*) FILTER (WHERE kind = 'reply' AND reason = 'sent')
		FROM kf_archive WHERE external_userid NOT IN ($1, $2)`, warmupUser, photoUser).Scan(&msgs, &msgids, &outcomes, &replies); err != nil {
		t.Fatal(err)
	}
	t.Logf("archive: %d message rows (%d msgids), %d messages with an outcome, %d replies sent; report in=%d processed=%d replies=%d",
		msgs, msgids, outcomes, replies, rep.In, rep.Processed, rep.RepliesSent)
	if msgs != rep.In || msgids != rep.In {
		t.Errorf("archive holds %d message rows of %d msgids, want the %d messages given to WeChat once each", msgs, msgids, rep.In)
	}
	if outcomes != rep.Processed {
		t.Errorf("archive holds an outcome for %d messages, want the %d processed", outcomes, rep.Processed)
	}
	if replies != rep.RepliesSent {
		t.Errorf("archive holds %d replies sent, want the report's %d", replies, rep.RepliesSent)
	}
	st, err := archive.Open(ctx, dsn, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, _, err := st.Conversation(ctx, "demo-excited", time.Now().Add(-24*time.Hour), time.Now().Add(time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rows {
		if r.Kind == archive.KindMessage {
			n++
		}
	}
	if n != 24 {
		t.Errorf("the excited customer's conversation in the archive has %d messages, want 24", n)
	}
}
