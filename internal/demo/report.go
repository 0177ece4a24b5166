package demo

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/obs/gather"
)

// Report is what a run found. The per-message figures are distinct
// upstream messages (open_kfid, msgid), not Kafka records.
type Report struct {
	In          int // messages added to the fake WeChat
	Redelivered int // of which WeChat handed out a second time (same msgid)
	Processed   int // distinct messages the business handler finished
	Duplicates  int // records the consumer's dedup recognised (kfpipe_messages_duplicate_total)
	DLQ         int // distinct messages dead-lettered at least once
	Recovered   int // dead-lettered, then re-injected by the dlq-consumer and processed
	Parked      int // still held in the DLQ (due later, e.g. blocked users, or manual review)
	Lost        int // neither processed nor held in the DLQ
	Reordered   int // processed after a later message of the same user without going through the DLQ (I4)
	// RecoveredLate are recovered messages handled after later messages
	// of their user: allowed, they left the order through the DLQ (I4).
	RecoveredLate   int
	DoubleEffects   int            // messages the handler finished more than once (I3)
	DLQRecords      map[string]int // dead-letter records by reason (a message may have several)
	HandlerFailures int            // handler calls failed by the outage
	// GateTransitions are the downstream gate's openings and closings
	// (the outage opens it: its messages wait instead of being
	// dead-lettered).
	GateTransitions int
	// Replies: sent to WeChat by the handler (one per processed message),
	// skipped because a handler that ran again had sent them already (a
	// duplicate reply prevented), refused by WeChat for good (the
	// 5-in-48h window); what the fake WeChat delivered, and how many sends
	// repeated a msgid it had delivered (0: none reached WeChat twice).
	RepliesSent, RepliesSkipped, RepliesRefused int
	RepliesAtWeChat, ReplyMsgIDRepeats          int
	// Photo is what the handler read of the customer's photo (PhotoBytes
	// sent) from the media store and answered; not in the other figures.
	Photo      photoSeen
	PhotoBytes int
	// AfterReplyFailures are handler calls failed on purpose after their
	// reply (one message in crashEvery, once each).
	AfterReplyFailures int

	MsgsPerSec float64       // processed / (last processed − scenario start)
	Peak       int           // most messages processed within one wall-clock second
	P50, P99   time.Duration // produced_at → handler, messages never dead-lettered
	// The same messages in two parts: those in flight while the
	// downstream was out for everybody (from the outage's start until
	// the first success after its end, when the gate closes) waited for
	// it; the others did not.
	// Messages of the failing users that were in flight during the
	// failure and not dead-lettered (retried by the consumer until the
	// fix) are apart too: Failing.
	// So are the messages in flight while the crowd (arriving at once)
	// was handled, the crowd's own included: Crowd.
	Calm, Outage, Failing, Crowd Latency
	// AtP99 counts, by latency class, the messages at or above P99: who
	// makes the p99.
	AtP99 map[string]int
	// CalmBy splits Calm by profile.
	CalmBy map[string]Latency
	// GateHeldAfter is how long after the outage's end the first
	// success came (the gate's next probe closes it).
	GateHeldAfter time.Duration
	Elapsed       time.Duration // scenario start → settled
	Settled       bool          // false: the drain deadline passed first

	// Recovery of the failing downstream's letters: FailedCalls are the
	// handler calls its users' messages failed; FixToFirst and FixToLast
	// the time from the fix to the first and last of their recovered
	// messages' handling. RecoveredOutOfOrder are recovered messages
	// handled before an earlier recovered message of their user (any
	// profile): each user's letters must come back in order.
	FailedCalls           int
	FixToFirst, FixToLast time.Duration
	RecoveredOutOfOrder   int
	// RecoveryRefused are messages the limiter refused when they came
	// back from the DLQ (a downstream_error letter, then a rate_limited or
	// user_blocked one), RefusedOnRecovery their users; BlockedByRecovery
	// are the users blocked now among those and the failing users.
	RecoveryRefused         int
	RefusedOnRecovery       []string
	BlockedByRecovery       []string
	RetryBase, ShippedRetry time.Duration // recovery.base_delay of the run, and as shipped
	Rule                    string        // the default group's limiter rule, as the report prints it
	Scenario                Scenario
	Planned                 time.Duration // the scenario's length

	// BlockedUsers are the users the limiter holds blocked when the report
	// is written (GET /admin/ratelimit/blocked).
	BlockedUsers map[string]time.Time

	Callbacks, CallbackErrors int

	// Profiles breaks the figures down by user profile (normal, excited,
	// bot, crowd), in that order.
	Profiles []ProfileCounts

	// LostSample names up to 10 lost messages (user/msgid and what the
	// DLQ index holds for each), to start an investigation from.
	LostSample []string

	AdminURL       string
	OperatorToken  string
	AdminUI        int  // HTTP status of GET /admin/ui/
	AdminDLQStats  int  // HTTP status of GET /admin/dlq/stats
	AdminBotStatus int  // HTTP status of GET /admin/ratelimit/status/{bot}
	BotBlocked     bool // what that answer said
}

// Latency is a set of messages' produce → handle times.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

func latencyOf(ds []time.Duration) Latency {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	l := Latency{N: len(ds), P50: quantile(ds, 0.50), P99: quantile(ds, 0.99)}
	if len(ds) > 0 {
		l.Max = ds[len(ds)-1]
	}
	return l
}

// ProfileCounts are one user profile's figures.
type ProfileCounts struct {
	Name                             string
	Users                            int
	In, Processed, DLQ, Recovered    int
	RateLimited, Blocked, Downstream int // dead-letter records by reason
	// Limited are the profile's messages the limiter refused at least once
	// (a rate_limited or user_blocked letter); BlockedUsers its users
	// blocked when the report is written.
	Limited      int
	BlockedUsers int
}

func profileOf(user string) string {
	switch {
	case user == botUser:
		return "bot"
	case user == excitedUser:
		return "excited"
	case strings.HasPrefix(user, failingPrefix):
		return "failing"
	case strings.HasPrefix(user, "demo-crowd-"):
		return "crowd"
	default:
		return "normal"
	}
}

// dlqView is the DLQ index grouped by message.
type dlqView struct {
	byMsg    map[string][]*dlq.Entry
	byReason map[string]int
}

func loadDLQ(ctx context.Context, idx *dlq.Index) (dlqView, error) {
	v := dlqView{byMsg: map[string][]*dlq.Entry{}, byReason: map[string]int{}}
	f := dlq.Filter{Limit: 1000}
	for {
		es, next, err := idx.List(ctx, f)
		if err == nil {
			err = idx.Whole(ctx, es) // the upstream msgid is in the letter
		}
		if err != nil {
			return v, err
		}
		for _, e := range es {
			v.byMsg[e.UpstreamMsgID] = append(v.byMsg[e.UpstreamMsgID], e)
			v.byReason[string(e.Reason)]++
		}
		if next == "" {
			return v, nil
		}
		f.Cursor = next
	}
}

// held reports whether the DLQ holds msgid without a retry in the next
// horizon: in review, or due later.
func (v dlqView) held(msgid string, now time.Time, horizon time.Duration) bool {
	for _, e := range v.byMsg[msgid] {
		switch e.State {
		case dlq.StateReview:
			return true
		case dlq.StateDue:
			if e.NextRetryTime == nil || e.NextRetryTime.After(now.Add(horizon)) {
				return true
			}
		}
	}
	return false
}

// progress counts the plan's messages that are finished (processed or
// held in the DLQ beyond horizon).
func progress(p *plan, rec recorded, v dlqView, now time.Time, horizon time.Duration) (settled, total int) {
	for _, m := range p.msgs {
		if m.id == "" {
			continue
		}
		total++
		if rec.handled[m.id] > 0 || v.held(m.id, now, horizon) {
			settled++
		}
	}
	return settled, total
}

// account fills the per-message figures of r.
func (r *Report) account(p *plan, rec recorded, v dlqView, now time.Time, start time.Time) {
	seqOf := map[string]int{}
	r.Profiles = []ProfileCounts{{Name: "normal"}, {Name: "failing"}, {Name: "excited"}, {Name: "bot"}, {Name: "crowd"}}
	prof := map[string]*ProfileCounts{}
	for i := range r.Profiles {
		prof[r.Profiles[i].Name] = &r.Profiles[i]
	}
	users := map[string]bool{}
	refusedAfterFailure := map[string]bool{} // users
	for _, m := range p.msgs {
		if m.id == "" {
			continue
		}
		pc := prof[profileOf(m.user)]
		pc.In++
		if !users[m.user] {
			users[m.user] = true
			pc.Users++
		}
		var limited, failed bool
		for _, e := range v.byMsg[m.id] {
			switch e.Reason {
			case dlq.ReasonRateLimited:
				pc.RateLimited++
				limited = true
			case dlq.ReasonUserBlocked:
				pc.Blocked++
				limited = true
			case dlq.ReasonDownstreamError:
				pc.Downstream++
				failed = true
			}
		}
		if limited {
			pc.Limited++
		}
		if limited && failed {
			r.RecoveryRefused++
			refusedAfterFailure[m.user] = true
		}
		if rec.handled[m.id] > 0 {
			pc.Processed++
		}
		if _, dead := v.byMsg[m.id]; dead {
			pc.DLQ++
			if rec.handled[m.id] > 0 {
				pc.Recovered++
			}
		}
		r.In++
		seqOf[m.id] = m.userSeq
		_, dead := v.byMsg[m.id]
		done := rec.handled[m.id] > 0
		switch {
		case done:
			r.Processed++
		case dead && v.held(m.id, now, 0):
			r.Parked++
		default:
			r.Lost++
			if len(r.LostSample) < 10 {
				desc := m.user + "/" + m.id
				for _, e := range v.byMsg[m.id] {
					desc += fmt.Sprintf(" [%s %s]", e.Reason, e.State)
				}
				r.LostSample = append(r.LostSample, desc)
			}
		}
		if dead {
			r.DLQ++
			if done {
				r.Recovered++
			}
		}
		if rec.handled[m.id] > 1 {
			r.DoubleEffects++
		}
	}
	r.DLQRecords = v.byReason
	for _, ids := range rec.seqs {
		maxSeq, maxRecovered := -1, -1
		for _, id := range ids {
			s, ok := seqOf[id]
			if !ok {
				continue
			}
			_, dead := v.byMsg[id]
			if dead {
				// Recovered letters keep their user's order among
				// themselves.
				if s < maxRecovered {
					r.RecoveredOutOfOrder++
				}
				maxRecovered = max(maxRecovered, s)
			}
			if s < maxSeq {
				if dead {
					r.RecoveredLate++
				} else {
					r.Reordered++
				}
				continue
			}
			if !dead {
				maxSeq = s
			}
		}
	}
	// A user is limited by a recovery when a message of theirs came back
	// from a downstream_error letter into the limiter's refusal; blocked
	// by it when such a user, or a failing user (nothing but their
	// downstream failed), is blocked (see blocks).
	r.RefusedOnRecovery = nil
	for u := range refusedAfterFailure {
		r.RefusedOnRecovery = append(r.RefusedOnRecovery, u)
	}
	sort.Strings(r.RefusedOnRecovery)
	outageEnd := rec.outageClosedAt
	if outageEnd.IsZero() {
		outageEnd = now
	}
	var lats, calm, held, failingLat, crowd []time.Duration
	class := map[string]string{} // msgid → latency class
	calmBy := map[string][]time.Duration{}
	// The crowd arrives at once: from its first message's production to
	// its last one's handling, every message queues behind it.
	var crowdFrom, crowdTo time.Time
	for id, u := range rec.userOf {
		if profileOf(u) != "crowd" {
			continue
		}
		if pr := rec.producedAt[id]; !pr.IsZero() && (crowdFrom.IsZero() || pr.Before(crowdFrom)) {
			crowdFrom = pr
		}
		if h := rec.handledAt[id]; h.After(crowdTo) {
			crowdTo = h
		}
	}
	for id, d := range rec.latency {
		if _, dead := v.byMsg[id]; !dead {
			if _, ours := seqOf[id]; ours {
				lats = append(lats, d)
				produced, handled := rec.producedAt[id], rec.handledAt[id]
				switch {
				case !rec.outageAt.IsZero() && produced.Before(outageEnd) && handled.After(rec.outageAt):
					held = append(held, d)
					class[id] = "waited on the outage"
				case !rec.failAt.IsZero() && profileOf(rec.userOf[id]) == "failing" && handled.After(rec.failAt) &&
					(rec.fixedAt.IsZero() || produced.Before(rec.fixedAt)):
					failingLat = append(failingLat, d)
					class[id] = "waited on the failure"
				case !crowdFrom.IsZero() && produced.Before(crowdTo) && handled.After(crowdFrom):
					crowd = append(crowd, d)
					class[id] = "came with the crowd"
				default:
					calm = append(calm, d)
					class[id] = "did not wait"
					calmBy[profileOf(rec.userOf[id])] = append(calmBy[profileOf(rec.userOf[id])], d)
				}
			}
		}
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50, r.P99 = quantile(lats, 0.50), quantile(lats, 0.99)
	r.Calm, r.Outage, r.Failing, r.Crowd = latencyOf(calm), latencyOf(held), latencyOf(failingLat), latencyOf(crowd)
	r.AtP99 = map[string]int{}
	for id, c := range class {
		if rec.latency[id] >= r.P99 && r.P99 > 0 {
			r.AtP99[c]++
		}
	}
	r.CalmBy = map[string]Latency{}
	for name, ds := range calmBy {
		r.CalmBy[name] = latencyOf(ds)
	}
	r.GateHeldAfter = 0
	if !rec.outageEndAt.IsZero() && !rec.outageClosedAt.IsZero() {
		r.GateHeldAfter = rec.outageClosedAt.Sub(rec.outageEndAt)
	}
	r.FixToFirst, r.FixToLast = 0, 0
	if !rec.fixedAt.IsZero() {
		for _, m := range p.msgs {
			if _, dead := v.byMsg[m.id]; !dead || profileOf(m.user) != "failing" {
				continue
			}
			at, ok := rec.handledAt[m.id]
			if !ok {
				continue
			}
			d := at.Sub(rec.fixedAt)
			if r.FixToFirst == 0 || d < r.FixToFirst {
				r.FixToFirst = d
			}
			r.FixToLast = max(r.FixToLast, d)
		}
	}
	r.FailedCalls = rec.failed
	if span := rec.last.Sub(start); span > 0 {
		r.MsgsPerSec = float64(r.Processed) / span.Seconds()
	}
	r.Peak = rec.peak
	r.HandlerFailures = rec.failures
	r.AfterReplyFailures = rec.replayed
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// counterValue sums a counter family of g's registry, all labels (0 when
// it cannot be read: the report shows what it has).
func counterValue(g prometheus.Gatherer, name string) float64 {
	v, _, _ := gather.Sum(g, name)
	return v
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Summary is the report's last line, exactly as scripts parse it.
func (r *Report) Summary() string {
	return fmt.Sprintf("demo: in=%d processed=%d duplicates=%d dlq=%d recovered=%d lost=%d reordered=%d replies=%d replies_dup_prevented=%d msgs_per_sec=%.1f p99_ms=%.1f",
		r.In, r.Processed, r.Duplicates, r.DLQ, r.Recovered, r.Lost, r.Reordered, r.RepliesSent, r.RepliesSkipped, r.MsgsPerSec, ms(r.P99))
}

// blocks records the users the limiter holds blocked: per profile, and
// the failing users among them as blocked by a recovery.
func (r *Report) blocks(blocked map[string]time.Time) {
	r.BlockedUsers = blocked
	for i := range r.Profiles {
		r.Profiles[i].BlockedUsers = 0
	}
	refused := map[string]bool{}
	for _, u := range r.RefusedOnRecovery {
		refused[u] = true
	}
	r.BlockedByRecovery = nil
	for u := range blocked {
		name := profileOf(u)
		for i := range r.Profiles {
			if r.Profiles[i].Name == name {
				r.Profiles[i].BlockedUsers++
			}
		}
		if name == "failing" || refused[u] {
			r.BlockedByRecovery = append(r.BlockedByRecovery, u)
		}
	}
	sort.Strings(r.BlockedByRecovery)
}

// Profile returns the figures of the profile name (zero if unknown).
func (r *Report) Profile(name string) ProfileCounts {
	for _, pc := range r.Profiles {
		if pc.Name == name {
			return pc
		}
	}
	return ProfileCounts{Name: name}
}

// describe says what the profile's users did in the scenario.
func (r *Report) describe(name string) string {
	s := r.Scenario
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" }
	switch name {
	case "normal":
		return fmt.Sprintf("customers chatting, a message every %s–%s", secs(s.GapMin), secs(s.GapMax))
	case "failing":
		return fmt.Sprintf("customers whose downstream failed from t=%s to t=%s (then fixed): %d messages each, %s apart",
			secs(s.FailAt), secs(s.FailAt+s.FailFor), s.FailMsgs, secs(s.FailGap))
	case "excited":
		var bs []string
		for _, b := range s.Excited {
			over := b.Over
			if over <= 0 {
				over = time.Duration(max(b.N-1, 0)) * b.gap()
			}
			bs = append(bs, fmt.Sprintf("%d in %s at t=%s", b.N, secs(over), secs(b.At)))
		}
		return "a human's bursts: " + strings.Join(bs, ", ")
	case "bot":
		return fmt.Sprintf("a flood: %d msg/s for %s", s.BotRate, secs(s.BotFor))
	case "crowd":
		return "one message each, all at once (a campaign)"
	}
	return ""
}

// verdict says whether the limiter refused or blocked the profile, and
// why, against the default group's rule.
func (r *Report) verdict(pc ProfileCounts) string {
	var b strings.Builder
	switch {
	case pc.Limited == 0:
		b.WriteString("not limited")
	default:
		fmt.Fprintf(&b, "limited: %d messages refused (rate_limited=%d user_blocked=%d letters)", pc.Limited, pc.RateLimited, pc.Blocked)
	}
	switch {
	case pc.BlockedUsers == 0 && pc.Users > 1:
		b.WriteString(", nobody blocked")
	case pc.BlockedUsers == 0:
		b.WriteString(", not blocked")
	case pc.Users > 1:
		fmt.Fprintf(&b, ", %d of %d users BLOCKED", pc.BlockedUsers, pc.Users)
	default:
		b.WriteString(", BLOCKED")
		for u, until := range r.BlockedUsers {
			if profileOf(u) == pc.Name && !until.IsZero() {
				fmt.Fprintf(&b, " until %s", until.UTC().Format("15:04:05 UTC"))
			}
		}
	}
	why := ""
	switch {
	case pc.Name == "failing" && pc.Limited > 0:
		why = "their letters came back from the DLQ into the limiter"
	case pc.BlockedUsers > 0:
		why = "kept sending above the rule until its refusals reached the penalty threshold"
	case pc.Limited > 0:
		why = "went above the rule, not long enough to be blocked"
	case pc.In > 0 && pc.Name != "failing":
		why = "stayed within the rule"
	case pc.In > 0:
		why = "their recovered letters were not counted against them"
	}
	if why != "" {
		fmt.Fprintf(&b, " — %s", why)
	}
	return b.String()
}

// Write prints the report; its last line is Summary.
func (r *Report) Write(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== kfpipe demo report ==\n")
	fmt.Fprintf(&b, "messages in:            %d (via %d signed callbacks, %d failed; %d re-delivered by WeChat with the same msgid)\n",
		r.In, r.Callbacks, r.CallbackErrors, r.Redelivered)
	fmt.Fprintf(&b, "processed:              %d (handler failures during the outage: %d; for the failing users: %d)\n",
		r.Processed, r.HandlerFailures, r.FailedCalls)
	outageLetters := r.DLQRecords["downstream_error"] - r.Profile("failing").Downstream
	fmt.Fprintf(&b, "downstream outage:      everybody's downstream out for %.0f s: held by the downstream gate (%d openings and closings), dead-lettered for it: %d\n",
		r.Scenario.OutageFor.Seconds(), r.GateTransitions, outageLetters)
	fmt.Fprintf(&b, "deduplicated:           %d records recognised as already done (I3); double effects: %d\n", r.Duplicates, r.DoubleEffects)
	fmt.Fprintf(&b, "replies:                %d sent to WeChat (it delivered %d; %d sends repeated a delivered msgid); %d duplicates prevented (the handler failed after replying %d times and ran again); %d refused by WeChat's 5-in-48h rule\n",
		r.RepliesSent, r.RepliesAtWeChat, r.ReplyMsgIDRepeats, r.RepliesSkipped, r.AfterReplyFailures, r.RepliesRefused)
	if r.Photo.Answer != "" {
		fmt.Fprintf(&b, "photo:                  a customer's %d-byte %s, kept in the media store before the handler ran, answered: %q\n",
			r.Photo.Bytes, r.Photo.ContentType, r.Photo.Answer)
	} else {
		fmt.Fprintf(&b, "photo:                  the customer's %d-byte image was NOT answered: %s\n", r.PhotoBytes, r.Photo.Err)
	}
	fmt.Fprintf(&b, "dead-lettered:          %d messages, records by reason:", r.DLQ)
	reasons := make([]string, 0, len(r.DLQRecords))
	for k := range r.DLQRecords {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	if len(reasons) == 0 {
		b.WriteString(" none")
	}
	for _, k := range reasons {
		fmt.Fprintf(&b, " %s=%d", k, r.DLQRecords[k])
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "by profile (limiter rule of the default group: %s):\n", r.Rule)
	for _, pc := range r.Profiles {
		if pc.In == 0 {
			continue
		}
		users := "users"
		if pc.Users == 1 {
			users = "user"
		}
		fmt.Fprintf(&b, "  %-8s %d %s, %s\n", pc.Name, pc.Users, users, r.describe(pc.Name))
		fmt.Fprintf(&b, "           in=%d processed=%d dead-lettered=%d (records: rate_limited=%d user_blocked=%d downstream_error=%d) recovered=%d\n",
			pc.In, pc.Processed, pc.DLQ, pc.RateLimited, pc.Blocked, pc.Downstream, pc.Recovered)
		fmt.Fprintf(&b, "           %s\n", r.verdict(pc))
	}
	fmt.Fprintf(&b, "recovered from the DLQ:  %d (re-injected and processed; %d of them after later messages of their user, allowed by I4; %d out of order among their user's recovered letters)\n",
		r.Recovered, r.RecoveredLate, r.RecoveredOutOfOrder)
	if f := r.Profile("failing"); f.In > 0 {
		fmt.Fprintf(&b, "  failing downstream:   %d of its %d dead-lettered messages brought back after the fix, the first %.1f s and the last %.1f s after it;\n",
			f.Recovered, f.DLQ, r.FixToFirst.Seconds(), r.FixToLast.Seconds())
		fmt.Fprintf(&b, "                        the scheduler retries a letter recovery.base_delay (%s) after its failure, doubling per retry",
			r.RetryBase)
		if r.RetryBase != r.ShippedRetry {
			fmt.Fprintf(&b, " —\n                        a demo override: the configured %s would bring them back only after the %.0f s scenario",
				r.ShippedRetry, r.Planned.Seconds())
		}
		b.WriteString("\n")
	}
	names := func(us []string) string {
		if len(us) == 0 {
			return "nobody"
		}
		return strings.Join(us, ", ")
	}
	fmt.Fprintf(&b, "  limited by a recovery: %s (%d messages refused by the limiter on their way back from the DLQ)\n",
		names(r.RefusedOnRecovery), r.RecoveryRefused)
	fmt.Fprintf(&b, "  blocked by a recovery: %s\n", names(r.BlockedByRecovery))
	fmt.Fprintf(&b, "still held in the DLQ:   %d (due later — e.g. the blocked bot — or in manual review)\n", r.Parked)
	fmt.Fprintf(&b, "lost:                   %d (neither processed nor held in the DLQ)\n", r.Lost)
	for _, l := range r.LostSample {
		fmt.Fprintf(&b, "  lost: %s\n", l)
	}
	fmt.Fprintf(&b, "per-user order:         %d reordered outside the DLQ\n", r.Reordered)
	fmt.Fprintf(&b, "throughput:             %.1f msg/s over the run (paced by the script), peak %d msg/s within one second\n", r.MsgsPerSec, r.Peak)
	fmt.Fprintf(&b, "latency produce→handle: p50 %.1f ms, p99 %.1f ms over the %d messages never dead-lettered (the last line's p99_ms); of them:\n",
		ms(r.P50), ms(r.P99), r.Calm.N+r.Outage.N+r.Failing.N+r.Crowd.N)
	lat := func(name string, l Latency) {
		fmt.Fprintf(&b, "  %-22s %d messages, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", name+":", l.N, ms(l.P50), ms(l.P99), ms(l.Max))
	}
	lat("did not wait", r.Calm)
	for _, pc := range r.Profiles {
		if l, ok := r.CalmBy[pc.Name]; ok && l.N > 0 {
			fmt.Fprintf(&b, "    %-20s %d messages, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", pc.Name+":", l.N, ms(l.P50), ms(l.P99), ms(l.Max))
		}
	}
	lat("waited on the outage", r.Outage)
	fmt.Fprintf(&b, "                         in flight between the outage's start and the gate's closing, %.1f s after the downstream\n", r.GateHeldAfter.Seconds())
	b.WriteString("                         was back (its next probe, one every outage.probe_interval): held by the gate, not dead-lettered.\n")
	if r.Crowd.N > 0 {
		lat("came with the crowd", r.Crowd)
		fmt.Fprintf(&b, "                         its %d users' messages arrive within 50 ms and queue behind each other (and the messages\n",
			r.Profile("crowd").In)
		b.WriteString("                         sent meanwhile behind them): their wait is the pipeline's throughput on this machine.\n")
	}
	if r.Failing.N > 0 {
		lat("waited on the failure", r.Failing)
		b.WriteString("                         the failing users' messages the consumer kept retrying until the fix instead of dead-lettering\n")
		b.WriteString("                         them (its gate suspected an outage).\n")
	}
	b.WriteString("  recovered letters are in none of these: their wait is the retry delay above.\n")
	if len(r.AtP99) > 0 {
		n := 0
		var parts []string
		for _, c := range []string{"came with the crowd", "waited on the outage", "waited on the failure", "did not wait"} {
			if r.AtP99[c] > 0 {
				n += r.AtP99[c]
				parts = append(parts, fmt.Sprintf("%d %s", r.AtP99[c], c))
			}
		}
		fmt.Fprintf(&b, "  who makes the p99:    of the %d messages at or above %.1f ms, %s\n", n, ms(r.P99), strings.Join(parts, ", "))
	}
	settled := "settled"
	if !r.Settled {
		settled = "NOT settled: drain deadline passed"
	}
	fmt.Fprintf(&b, "run:                    %.1f s, %s\n", r.Elapsed.Seconds(), settled)
	fmt.Fprintf(&b, "admin console:          %s/admin/ui/ (operator token %s): ui=%d dlq_stats=%d bot_status=%d bot_blocked=%t\n",
		r.AdminURL, r.OperatorToken, r.AdminUI, r.AdminDLQStats, r.AdminBotStatus, r.BotBlocked)
	b.WriteString(r.Summary())
	b.WriteString("\n")
	_, _ = io.WriteString(w, b.String())
}
