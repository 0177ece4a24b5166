package chaos

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// Applied is a Step as the run carried it out: the wall-clock times of
// the injection and of the repair, and the customer a user-targeted step
// resolved to.
type Applied struct {
	Step
	User       string // the customer of a user-targeted step (FailUser, ReplyServicer, SlowHandler, HumanBurst)
	Start, End time.Time
	Err        string // the step could not be carried out
	// Finding: the step was carried out but the system misbehaved doing
	// it (a daemon that hung on SIGTERM or exited non-zero): a violation.
	Finding string
	// Note: what the step observed it did (a layout's generations before
	// and after, the partition count), for the log.
	Note string
}

// NemesisRun is what the checker reads besides the evidence: the schedule,
// what was applied, and who flooded.
type NemesisRun struct {
	Schedule Schedule
	Applied  []Applied
	Flooders map[string]bool // users that flooded (bots, human bursts are not floods)
	// BaseStall is the longest a message may wait for its effect when no
	// fault explains more (a loaded 2-core machine, commit interval,
	// session timeouts of routine rebalances).
	BaseStall time.Duration
}

// Verdict is the nemesis checker's outcome over the whole run.
type Verdict struct {
	Lost, Dup, Reordered int
	RepliesDup           int // a reply delivered twice (by WeChat msgid) outside a kill's window
	RepliesMissing       int // an effect with no reply that no servicer hold explains
	RepliesReordered     int
	RepliesRefusedQuota  int // a reply WeChat's 5-after-each-message rule refused (95001): routine
	LettersUnexplained   int // a dead letter whose reason no step of the schedule explains
	Blocked              int // customers who did not flood whose wait exceeded what the schedule explains
	StallsOver           int // messages whose wait exceeded what the schedule explains
	Crashes              int
	ShutdownFailures     int // a SIGTERM the daemon did not answer with a clean exit in time
	// Figures.
	Messages, Effects, Deliveries, Replies, RepliesResent, Letters int
	Stalls                                                         int           // messages that waited more than 10 s
	MaxStall                                                       time.Duration // the longest wait of a message of a customer who did not flood
	Redelivered                                                    int
	FaultsByKind                                                   map[FaultKind]int
	Violations                                                     []string // first ones first
}

// OK reports whether the run is clean.
func (v *Verdict) OK() bool {
	return v.Lost+v.Dup+v.Reordered+v.RepliesDup+v.RepliesMissing+v.RepliesReordered+v.LettersUnexplained+v.Blocked+
		v.StallsOver+v.Crashes+v.ShutdownFailures == 0 && len(v.Violations) == 0
}

// Line is the verdict line.
func (v *Verdict) Line() string {
	kinds := make([]string, 0, len(v.FaultsByKind))
	faults := 0
	for k, n := range v.FaultsByKind {
		kinds = append(kinds, fmt.Sprintf("%s:%d", k, n))
		faults += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("lost=%d dup=%d reordered=%d replies_dup=%d replies_missing=%d replies_reordered=%d "+
		"letters_unexplained=%d blocked=%d stalls_over_bound=%d crashes=%d shutdown_failures=%d | messages=%d effects=%d deliveries=%d "+
		"redelivered_after_kill=%d replies=%d replies_resent_after_kill=%d replies_refused_95001=%d letters=%d stalls_over_10s=%d max_stall=%s "+
		"faults=%d fault_kinds=%d [%s]",
		v.Lost, v.Dup, v.Reordered, v.RepliesDup, v.RepliesMissing, v.RepliesReordered, v.LettersUnexplained, v.Blocked,
		v.StallsOver, v.Crashes, v.ShutdownFailures, v.Messages, v.Effects, v.Deliveries, v.Redelivered, v.Replies, v.RepliesResent, v.RepliesRefusedQuota, v.Letters,
		v.Stalls, v.MaxStall.Round(100*time.Millisecond), faults, len(v.FaultsByKind), strings.Join(kinds, ","))
}

func (v *Verdict) violate(format string, args ...any) {
	v.Violations = append(v.Violations, fmt.Sprintf(format, args...))
}

// letterCauses are, for each dead-letter reason, the kinds of step that
// can explain it; userBound kinds explain it only for their own customer.
var letterCauses = map[string][]FaultKind{
	"downstream_error": {FailUser, FailAll, ReceiverSlow, ReceiverFlaky, SlowHandler},
	"circuit_open":     {FailUser, FailAll, ReceiverSlow, ReceiverFlaky, SlowHandler},
	"process_timeout":  {ReceiverSlow, SlowHandler, ConsumerFreeze, RedisPartition, RedisDelay, RedisReset, SentinelFailover},
	"kafka_failure":    {BrokerKill9, BrokerStop},
	"queue_full":       {Flood, HumanBurst, ReceiverSlow, SlowHandler, LayoutChange},
	"system_overload":  {Flood, HumanBurst, ReceiverSlow, SlowHandler, LayoutChange},
}

var userBound = map[FaultKind]bool{FailUser: true, SlowHandler: true, HumanBurst: true, ReplyServicer: true}

// stallGrace is how much longer than the fault itself a step may hold a
// message up: the repair (restart, session timeout, an expired claim
// lease), the retries and backoffs it causes.
func stallGrace(k FaultKind, lease time.Duration) (grace time.Duration, stalls bool) {
	switch k {
	case ConsumerKill9, ConsumerFreeze, ConsumerRestart, ScaleIn, ScaleOut:
		return lease + 20*time.Second, true
	case ProducerKill9, ProducerRestart, ProducerFreeze, SyncThrottle:
		return 15 * time.Second, true
	case RedisDelay, RedisReset, RedisPartition:
		return lease + 15*time.Second, true
	case ReceiverSlow, FailAll, ReceiverFlaky:
		return 30 * time.Second, true
	case ReplyThrottle:
		return 10 * time.Second, true
	case BrokerKill9, BrokerStop:
		return 30 * time.Second, true
	case SentinelFailover:
		// The sentinels' verdict (1 s down-after), the promotion, every
		// client's reconnection; then the lease of a claim the old
		// primary held.
		return lease + 20*time.Second, true
	case PartitionsAdded:
		// The producer is stopped for the whole step (WeChat keeps the
		// messages); the restarts' rebalances follow it.
		return lease + 20*time.Second, true
	case LayoutChange:
		// A thousand messages at once in one partition.
		return 30 * time.Second, true
	case DLQKill9, DLQRestart:
		return 0, false // the dlq-consumer is not on a message's way
	}
	return 0, false
}

// Check judges the run: rep is the harness's report of the evidence (lost,
// dup, reordered by the shared judge, crashes), ev the evidence with the
// fake's replies, run the schedule and what was applied.
func Check(ev *Evidence, rep *Report, replies, replyDups []wecomtest.Reply, run NemesisRun) *Verdict {
	v := &Verdict{Lost: rep.Lost, Dup: rep.Dup, Reordered: rep.Reordered, Messages: len(ev.Sent), Effects: rep.Effects,
		Deliveries: rep.Deliveries, Letters: rep.DLQ, Redelivered: rep.Redelivered, Crashes: len(ev.Crashes),
		FaultsByKind: map[FaultKind]int{}}
	for _, a := range run.Applied {
		if a.Err == "" {
			v.FaultsByKind[a.Kind]++
		}
		if a.Finding != "" {
			v.ShutdownFailures++
			v.violate("step %s: %s", a.Step, a.Finding)
		}
	}
	for _, n := range rep.notes {
		// A repeat whose first effect lay just before a Redis failover
		// (its done mark not yet replicated) is the harness's
		// dup_after_failover, counted apart and bounded by the window.
		if strings.HasPrefix(n, "dup after failover ") {
			continue
		}
		if strings.HasPrefix(n, "lost ") || strings.HasPrefix(n, "dup ") || strings.HasPrefix(n, "reordered ") {
			v.violate("%s", n)
		}
	}
	for _, c := range ev.Crashes {
		v.violate("daemon crash: %s", c)
	}
	for _, p := range rep.problems {
		v.violate("%s", p)
	}
	lease := ev.Lease
	sent := map[string]Sent{}
	for _, s := range ev.Sent {
		sent[s.MsgID] = s
	}
	first := map[string]time.Time{}
	for _, d := range ev.Deliveries {
		if t, ok := first[d.MsgID]; !ok || d.At.Before(t) {
			first[d.MsgID] = d.At
		}
	}
	byKind := map[FaultKind][]Applied{}
	for _, a := range run.Applied {
		if a.Err == "" {
			byKind[a.Kind] = append(byKind[a.Kind], a)
		}
	}

	// Dead letters: each for a reason a step of the run explains.
	for id, ls := range ev.DLQ {
		s, ok := sent[id]
		if !ok {
			continue
		}
		for _, l := range ls {
			if run.Flooders[s.User] && (l.Reason == "rate_limited" || l.Reason == "user_blocked") {
				continue
			}
			explained := false
			for _, k := range letterCauses[l.Reason] {
				for _, a := range byKind[k] {
					if !userBound[k] || a.User == s.User {
						explained = true
					}
				}
			}
			if !explained {
				v.LettersUnexplained++
				if v.LettersUnexplained <= 5 {
					v.violate("dead letter %s of %s for %s: no step of the schedule explains it", id, s.User, l.Reason)
				}
			}
		}
	}

	// Stalls: each message's wait for its first effect, bounded by the
	// steps that overlapped it.
	blocked := map[string]bool{}
	for _, s := range ev.Sent {
		if run.Flooders[s.User] || len(ev.DLQ[s.MsgID]) > 0 {
			continue
		}
		t, ok := first[s.MsgID]
		if !ok {
			continue // lost: counted above
		}
		wait := t.Sub(s.At)
		if wait > 10*time.Second {
			v.Stalls++
		}
		if wait > v.MaxStall {
			v.MaxStall = wait
		}
		bound := run.BaseStall
		for _, a := range run.Applied {
			if a.Err != "" {
				continue
			}
			grace, stalls := stallGrace(a.Kind, lease)
			if a.Kind == SlowHandler && a.User == s.User {
				// The customer's own backlog: each message of theirs sent
				// while the handler was slow takes Arg.
				n := 0
				for _, o := range ev.Sent {
					if o.User == s.User && !o.At.Before(a.Start) && !o.At.After(a.End) {
						n++
					}
				}
				grace, stalls = time.Duration(n+1)*time.Duration(a.Arg)*time.Millisecond+10*time.Second, true
			}
			if a.Kind == ReceiverSlow {
				// A receiver slower than the load leaves a backlog that
				// drains after it recovers: the longer and the slower, the
				// more.
				grace += time.Duration(float64(a.End.Sub(a.Start)) * float64(a.Arg) / 1000)
			}
			if !stalls {
				continue
			}
			if a.Start.Before(t) && a.End.Add(grace).After(s.At) {
				bound += a.End.Sub(a.Start) + grace
			}
		}
		if wait > bound {
			v.StallsOver++
			blocked[s.User] = true
			if v.StallsOver <= 5 {
				v.violate("stall: message %s of %s waited %s for its effect, more than the %s the schedule explains",
					s.MsgID, s.User, wait.Round(100*time.Millisecond), bound.Round(100*time.Millisecond))
			}
		}
	}
	v.Blocked = len(blocked)

	// Replies: one per effect, by WeChat msgid at most once, in the
	// customer's order; a servicer's hold explains a missing one.
	held := map[string]bool{}
	for _, a := range byKind[ReplyServicer] {
		held[a.User] = true
	}
	v.Replies = len(replies)
	got := map[string]bool{}
	last := map[string]int{}
	for _, rp := range replies {
		var body struct {
			Content string `json:"content"`
		}
		_ = json.Unmarshal(rp.Body, &body)
		id := strings.TrimPrefix(body.Content, ReplyText(""))
		s, ok := sent[id]
		if !ok {
			continue
		}
		got[id] = true
		if prev, seen := last[s.User]; seen && s.Index < prev && len(ev.DLQ[id]) == 0 {
			v.RepliesReordered++
			if v.RepliesReordered <= 5 {
				v.violate("reply to message %d of %s after the reply to message %d", s.Index, s.User, prev)
			}
		}
		last[s.User] = max(last[s.User], s.Index)
	}
	// WeChat takes 5 messages after each message of the customer (95001
	// after that, a routine refusal that finishes the message): a reply
	// the fake WeChat refused so is explained. Its own record, not a guess
	// from the times: a reply waits for its slot under the replies' limit
	// and for its turn after the user's earlier ones, so it may leave long
	// after its effect.
	refusedQuota := map[string]bool{}
	for _, rf := range ev.ReplyRefusals {
		var body struct {
			Content string `json:"content"`
		}
		_ = json.Unmarshal(rf.Body, &body)
		if id, ok := strings.CutPrefix(body.Content, ReplyText("")); ok && rf.Errcode == 95001 {
			refusedQuota[id] = true
		}
	}
	for id := range first {
		s, ok := sent[id]
		if !ok || got[id] || held[s.User] || len(ev.DLQ[id]) > 0 {
			continue
		}
		if refusedQuota[id] {
			v.RepliesRefusedQuota++
			continue
		}
		v.RepliesMissing++
		if v.RepliesMissing <= 5 {
			v.violate("no reply to %s of %s (no servicer held the session)", id, s.User)
		}
	}
	var kills []Kill
	for _, k := range ev.Kills {
		if strings.HasPrefix(k.Tag, "consumer") {
			kills = append(kills, k)
		}
	}
	byMsgID := map[string]wecomtest.Reply{}
	for _, rp := range replies {
		byMsgID[rp.MsgID] = rp
	}
	for _, d := range replyDups {
		firstRp, ok := byMsgID[d.MsgID]
		explained := false
		for _, k := range kills {
			explained = explained || ok && !k.At.Before(firstRp.At.Add(-inFlightSlack)) && k.At.Sub(firstRp.At) <= ev.crashWindow()
		}
		// The reply's claim written to a primary killed before it
		// replicated: the failover's window, as for an effect.
		for _, f := range ev.Failovers {
			explained = explained || ok && f.covers(firstRp.At, ev.FailoverWindow)
		}
		if explained {
			v.RepliesResent++
			continue
		}
		v.RepliesDup++
		if v.RepliesDup <= 5 {
			v.violate("reply sent twice: WeChat msgid %s to %s, first %s, again %s", d.MsgID, d.User,
				firstRp.At.Format("15:04:05.000"), d.At.Format("15:04:05.000"))
		}
	}
	return v
}
