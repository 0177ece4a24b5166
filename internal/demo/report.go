package demo

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/dlq"
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
	// AfterReplyFailures are handler calls failed on purpose after their
	// reply (one message in crashEvery, once each).
	AfterReplyFailures int

	MsgsPerSec float64       // processed / (last processed − scenario start)
	Peak       int           // most messages processed within one wall-clock second
	P50, P99   time.Duration // produced_at → handler, messages never dead-lettered
	Elapsed    time.Duration // scenario start → settled
	Settled    bool          // false: the drain deadline passed first

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

// ProfileCounts are one user profile's figures.
type ProfileCounts struct {
	Name                             string
	In, Processed, DLQ, Recovered    int
	RateLimited, Blocked, Downstream int // dead-letter records by reason
}

func profileOf(user string) string {
	switch {
	case user == botUser:
		return "bot"
	case user == excitedUser:
		return "excited"
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
	r.Profiles = []ProfileCounts{{Name: "normal"}, {Name: "excited"}, {Name: "bot"}, {Name: "crowd"}}
	prof := map[string]*ProfileCounts{}
	for i := range r.Profiles {
		prof[r.Profiles[i].Name] = &r.Profiles[i]
	}
	for _, m := range p.msgs {
		if m.id == "" {
			continue
		}
		pc := prof[profileOf(m.user)]
		pc.In++
		for _, e := range v.byMsg[m.id] {
			switch e.Reason {
			case dlq.ReasonRateLimited:
				pc.RateLimited++
			case dlq.ReasonUserBlocked:
				pc.Blocked++
			case dlq.ReasonDownstreamError:
				pc.Downstream++
			}
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
		maxSeq := -1
		for _, id := range ids {
			s, ok := seqOf[id]
			if !ok {
				continue
			}
			_, dead := v.byMsg[id]
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
	var lats []time.Duration
	for id, d := range rec.latency {
		if _, dead := v.byMsg[id]; !dead {
			if _, ours := seqOf[id]; ours {
				lats = append(lats, d)
			}
		}
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50, r.P99 = quantile(lats, 0.50), quantile(lats, 0.99)
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

// counterValue sums a counter family of g's registry, all labels.
func counterValue(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
		}
	}
	return sum
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Summary is the report's last line, exactly as scripts parse it.
func (r *Report) Summary() string {
	return fmt.Sprintf("demo: in=%d processed=%d duplicates=%d dlq=%d recovered=%d lost=%d reordered=%d replies=%d replies_dup_prevented=%d msgs_per_sec=%.1f p99_ms=%.1f",
		r.In, r.Processed, r.Duplicates, r.DLQ, r.Recovered, r.Lost, r.Reordered, r.RepliesSent, r.RepliesSkipped, r.MsgsPerSec, ms(r.P99))
}

// Write prints the report; its last line is Summary.
func (r *Report) Write(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== kfpipe demo report ==\n")
	fmt.Fprintf(&b, "messages in:            %d (via %d signed callbacks, %d failed; %d re-delivered by WeChat with the same msgid)\n",
		r.In, r.Callbacks, r.CallbackErrors, r.Redelivered)
	fmt.Fprintf(&b, "processed:              %d (handler failures during the outage: %d)\n", r.Processed, r.HandlerFailures)
	fmt.Fprintf(&b, "downstream outage:      held by the downstream gate (%d openings and closings), %d messages dead-lettered for it\n",
		r.GateTransitions, r.DLQRecords["downstream_error"])
	fmt.Fprintf(&b, "deduplicated:           %d records recognised as already done (I3); double effects: %d\n", r.Duplicates, r.DoubleEffects)
	fmt.Fprintf(&b, "replies:                %d sent to WeChat (it delivered %d; %d sends repeated a delivered msgid); %d duplicates prevented (the handler failed after replying %d times and ran again); %d refused by WeChat's 5-in-48h rule\n",
		r.RepliesSent, r.RepliesAtWeChat, r.ReplyMsgIDRepeats, r.RepliesSkipped, r.AfterReplyFailures, r.RepliesRefused)
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
	for _, pc := range r.Profiles {
		if pc.In == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %-8s in=%d processed=%d dead-lettered=%d (records: rate_limited=%d user_blocked=%d downstream_error=%d) recovered=%d\n",
			pc.Name, pc.In, pc.Processed, pc.DLQ, pc.RateLimited, pc.Blocked, pc.Downstream, pc.Recovered)
	}
	fmt.Fprintf(&b, "recovered from the DLQ:  %d (re-injected and processed; %d of them after later messages of their user, allowed by I4)\n",
		r.Recovered, r.RecoveredLate)
	fmt.Fprintf(&b, "still held in the DLQ:   %d (due later — e.g. the blocked bot — or in manual review)\n", r.Parked)
	fmt.Fprintf(&b, "lost:                   %d (neither processed nor held in the DLQ)\n", r.Lost)
	for _, l := range r.LostSample {
		fmt.Fprintf(&b, "  lost: %s\n", l)
	}
	fmt.Fprintf(&b, "per-user order:         %d reordered outside the DLQ\n", r.Reordered)
	fmt.Fprintf(&b, "throughput:             %.1f msg/s over the run (paced by the script), peak %d msg/s within one second\n", r.MsgsPerSec, r.Peak)
	fmt.Fprintf(&b, "latency produce→handle: p50 %.1f ms, p99 %.1f ms (messages never dead-lettered)\n", ms(r.P50), ms(r.P99))
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
