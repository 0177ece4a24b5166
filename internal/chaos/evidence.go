package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/judge"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// DeadLetter is what the DLQ index holds for one message.
type DeadLetter struct {
	ID     string
	MsgID  string
	User   string
	Reason string
	State  string
}

// Evidence is everything a scenario is judged on, gathered from outside
// the daemons.
type Evidence struct {
	Sent       []Sent
	Deliveries []Delivery
	DLQ        map[string][]DeadLetter // by upstream msgid
	Kafka      map[string]int          // upstream msgid → records on the main topic
	KafkaTotal int
	Kills      []Kill
	Lease      time.Duration
	Crashes    []string
	// Failovers are the kills of the Redis primary; a repeat whose
	// previous effect lies in [Issued-FailoverWindow, Done+100ms] of one
	// is explained by the asynchronous replication of its done mark (or a
	// done mark the dying primary never answered).
	Failovers      []Failover
	FailoverWindow time.Duration
	// Cuts are consumer incarnations cut off from Redis (Tag, At): a
	// repeat whose previous effect that incarnation made in
	// [At-FailoverWindow, At+100ms] is explained by its done mark, in
	// flight when the link went, never reaching Redis; the claim then
	// expires and the next owner runs the handler again — the crash
	// window, without the crash.
	Cuts []Kill
	// StallLimit, when set, is the longest a user may wait for its next
	// effect after a consumer kill (max_user_stall); more is a problem.
	StallLimit time.Duration
	// InFlightSlack: Options.InFlightSlack (0: inFlightSlack).
	InFlightSlack time.Duration
	// KillsNotForStalls: Options.KillsNotForStalls.
	KillsNotForStalls bool
	// Replies (with Options.Replies) are the messages the fake WeChat
	// delivered, and ReplyDups the repeats of a delivered msgid it refused.
	Replies, ReplyDups []wecomtest.Reply
	// ReplyRefusals are the sends the fake WeChat refused for the
	// customer's session (95001: five messages since the customer's last).
	ReplyRefusals []wecomtest.Refusal
	RepliesOn     bool
}

// DeadLetters reads the whole DLQ index through the admin API's export,
// whose letters are whole (read back from the DLQ topic): the index's
// lists carry summaries without the message.
func (p *Pipeline) DeadLetters(ctx context.Context) (map[string][]DeadLetter, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AdminURL+"/admin/dlq/export?format=json", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("dlq admin: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("dlq admin export: %s", resp.Status)
	}
	out := map[string][]DeadLetter{}
	dec := json.NewDecoder(resp.Body)
	for {
		var m struct {
			ID      string          `json:"id"`
			User    string          `json:"user"`
			Reason  string          `json:"reason"`
			State   string          `json:"state"`
			Message json.RawMessage `json:"message"`
		}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("dlq admin export: decode: %w", err)
		}
		var orig struct {
			UpstreamMsgID string `json:"upstream_msgid"`
		}
		_ = json.Unmarshal(m.Message, &orig)
		out[orig.UpstreamMsgID] = append(out[orig.UpstreamMsgID],
			DeadLetter{ID: m.ID, MsgID: orig.UpstreamMsgID, User: m.User, Reason: m.Reason, State: m.State})
	}
}

// DumpMainTopic reads the whole main topic with kcat and counts the
// records of each upstream msgid (from the upstream_msgid header).
func (p *Pipeline) DumpMainTopic(ctx context.Context) (map[string]int, int, error) {
	counts := map[string]int{}
	total := 0
	err := p.eachMainHeaders(ctx, func(hs map[string]string) {
		total++
		if v, ok := hs["upstream_msgid"]; ok {
			counts[v]++
		}
	})
	return counts, total, err
}

// eachMainHeaders reads the whole main topic with kcat (read_committed,
// as the consumers read it) and hands each record's headers to fn.
func (p *Pipeline) eachMainHeaders(ctx context.Context, fn func(map[string]string)) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.Opts.Kcat, "-b", p.Opts.Brokers, "-C", "-t", p.MainTopic, "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%h\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("kcat: %v: %s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		hs := map[string]string{}
		for _, h := range strings.Split(sc.Text(), ",") {
			if k, v, ok := strings.Cut(h, "="); ok {
				hs[k] = v
			}
		}
		fn(hs)
	}
	return sc.Err()
}

// Settle waits until every message fed has an effect or a dead letter,
// then for a quiet period (the dedup lease plus 3 s, so a redelivery after
// an expired claim would still show). It gives up at timeout; the
// evidence then shows what is missing.
func (p *Pipeline) Settle(ctx context.Context, f *Feeder, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	quiet := p.Opts.DedupLease + 3*time.Second
	var missing []Sent
	for {
		missing = missing[:0]
		for _, s := range f.Sent() {
			if !p.Sink.Has(s.MsgID) {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			// Only ask the DLQ about what the Sink has not seen.
			if dl, err := p.DeadLetters(ctx); err == nil {
				kept := missing[:0]
				for _, s := range missing {
					if len(dl[s.MsgID]) == 0 {
						kept = append(kept, s)
					}
				}
				missing = kept
			}
		}
		_, last := p.Sink.Len()
		if len(missing) == 0 && time.Since(last) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %s: %d messages without effect or dead letter", timeout, len(missing))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Collect gathers the evidence: the Sink's deliveries, the DLQ index, a
// kcat dump of the main topic and the kills.
func (p *Pipeline) Collect(ctx context.Context, f *Feeder) (*Evidence, error) {
	ev := &Evidence{Sent: f.Sent(), Deliveries: p.Sink.Deliveries(), Kills: p.Kills(), Lease: p.Opts.DedupLease,
		Crashes: p.Crashes(), Failovers: p.Failovers(), Cuts: p.Cuts(), FailoverWindow: p.Opts.FailoverWindow, StallLimit: p.Opts.StallLimit, KillsNotForStalls: p.Opts.KillsNotForStalls, InFlightSlack: p.Opts.InFlightSlack,
		RepliesOn: p.Opts.Replies}
	if ev.RepliesOn {
		ev.Replies, ev.ReplyDups, ev.ReplyRefusals = p.Fake.Replies("", ""), p.Fake.Duplicates(), p.Fake.Refusals()
	}
	var err error
	if ev.DLQ, err = p.DeadLetters(ctx); err != nil {
		return nil, err
	}
	if ev.Kafka, ev.KafkaTotal, err = p.DumpMainTopic(ctx); err != nil {
		return nil, err
	}
	return ev, nil
}

// Failover is one kill of the Redis primary: the kill command was issued
// at Issued and had returned by Done (the process is gone by then).
type Failover struct{ Issued, Done time.Time }

func (f Failover) covers(at time.Time, window time.Duration) bool {
	return !at.Before(f.Issued.Add(-window)) && !at.After(f.Done.Add(100*time.Millisecond))
}

// inFlightSlack is how long after its incarnation's kill an effect may
// reach the Sink: a request the killed process had sent before it died.
const inFlightSlack = 2 * time.Second

// crashWindow is how long after a delivery a kill of the process that made
// it explains a second delivery: the claim lease (the redelivery waits for
// it) plus slack for the done mark that did not get written.
func (e *Evidence) crashWindow() time.Duration { return e.Lease + 2*time.Second }

// inFlight is how late after a kill the Sink may stamp a request the
// victim sent before it.
func (e *Evidence) inFlight() time.Duration {
	if e.InFlightSlack > 0 {
		return e.InFlightSlack
	}
	return inFlightSlack
}

// Report computes the counts. lost: sent, no effect and no dead letter.
// dup: a second (or later) effect not explained by a kill -9 of the
// process that made the previous one, within crashWindow after it.
// reordered: per user, a first effect that comes after the first effect
// of a message later in the WeChat order (messages that went through the
// DLQ are left out: they leave the order with a recorded reason).
func (e *Evidence) Report(name string, elapsed time.Duration) *Report {
	r := &Report{Name: name, Duration: elapsed, Sent: len(e.Sent)}
	sent := make(map[string]Sent, len(e.Sent))
	for _, s := range e.Sent {
		sent[s.MsgID] = s
	}
	byMsg := map[string][]Delivery{}
	for _, d := range e.Deliveries {
		byMsg[d.MsgID] = append(byMsg[d.MsgID], d)
	}
	r.Deliveries = len(e.Deliveries)
	killsByTag := map[string][]time.Time{}
	type frozen struct{ from, to time.Time }
	freezesByTag := map[string][]frozen{}
	for _, k := range e.Kills {
		killsByTag[k.Tag] = append(killsByTag[k.Tag], k.At)
		if k.Freeze {
			to := k.Thaw
			if to.IsZero() {
				to = k.At.Add(e.inFlight()) // never thawed (killed while frozen)
			}
			freezesByTag[k.Tag] = append(freezesByTag[k.Tag], frozen{k.At, to})
		}
	}
	explained := func(prev Delivery) bool {
		for _, f := range freezesByTag[prev.Tag] {
			// A frozen process sends nothing: an effect the Sink stamped
			// while it was frozen is a request it sent before, however
			// long the receiver took (a 30 s bot), with no mark to follow
			// until the thaw — a kill's in-flight window, as long as the
			// freeze. After the thaw the usual slack holds: a resumed
			// owner must start nothing past its lease (issue 43).
			if !prev.At.Before(f.from) && !prev.At.After(f.to.Add(inFlightSlack)) {
				return true
			}
		}
		for _, at := range killsByTag[prev.Tag] {
			// The kill came soon enough after the delivery that the done
			// mark can have been missing — or before it: a killed
			// incarnation makes no new effect, so one the Sink stamped
			// after the kill was a request in flight at the kill (the Sink
			// stamps on arrival, after its sleep, which a loaded machine
			// delays: a CI run saw three stamped more than 100 ms after
			// the kill). inFlightSlack bounds how late such a request can
			// arrive.
			if !at.Before(prev.At.Add(-e.inFlight())) && at.Sub(prev.At) <= e.crashWindow() {
				return true
			}
		}
		return false
	}
	// afterFailover: prev's done mark can have been acknowledged by the old
	// primary and lost with it (or its write failed with the primary).
	afterFailover := func(prev Delivery) bool {
		for _, f := range e.Failovers {
			if f.covers(prev.At, e.FailoverWindow) {
				return true
			}
		}
		return false
	}
	// late: the effects made after their caller gave up, by Seq, with
	// when their request arrived.
	late := map[int]time.Time{}
	for _, d := range e.Deliveries {
		if d.Late {
			late[d.Seq] = d.Arrived
		}
	}
	v := judge.Judge(judge.Input{Sent: judgeSent(e.Sent), Effects: judgeEffects(e.Deliveries), Dead: e.dead(),
		Explain: func(p, next judge.Effect) judge.Cause {
			prev := Delivery{Seq: p.Seq, MsgID: p.MsgID, User: p.User, Tag: p.Tag, At: p.At}
			switch {
			case explained(prev):
				return judge.Crash
			case afterFailover(prev):
				return judge.Failover
			}
			if _, ok := late[prev.Seq]; ok {
				return judge.Late // the caller could not know of it
			}
			// A call its caller cancelled (a hand-over's drain limit) that
			// the receiver finished after the next owner's call: it was
			// in flight before prev's effect, so no mark could stop it.
			if arrived, ok := late[next.Seq]; ok && !arrived.IsZero() && arrived.Before(prev.At) {
				return judge.Late
			}
			return judge.Unexplained
		}})
	for _, u := range v.Unknown {
		r.Problem("effect for a message never sent: %s (from %s)", u.MsgID, u.Tag)
	}
	r.Effects, r.DLQ = v.Effects, v.Dead
	r.Dup, r.DupAfterFailover, r.Redelivered = v.Dup(), v.Count(judge.Failover), v.Count(judge.Crash)
	if n := v.Count(judge.Late); n > 0 {
		r.Extra("dup_after_timeout", n) // the receiver answered after the caller gave up
	}
	dups, failovers := 0, 0
	for _, rp := range v.Repeats {
		switch rp.Cause {
		case judge.Unexplained:
			if dups++; dups <= 5 {
				r.note("dup %s user %s: %s", rp.MsgID, rp.User, describeDeliveries(byMsg[rp.MsgID]))
			}
		case judge.Failover:
			if failovers++; failovers <= 5 {
				r.note("dup after failover %s user %s: %s", rp.MsgID, rp.User, describeDeliveries(byMsg[rp.MsgID]))
			}
		}
	}
	r.Lost = len(v.Lost)
	for i, s := range v.Lost {
		if i < 5 {
			r.note("lost %s user %s account %s (kafka records %d)", s.MsgID, s.User, sent[s.MsgID].OpenKfID, e.Kafka[s.MsgID])
		}
	}
	for _, s := range e.Sent {
		if e.Kafka[s.MsgID] > 0 {
			r.InKafka++
		}
	}
	r.KafkaRecords = e.KafkaTotal
	r.Reordered = len(v.Reordered)
	for i, o := range v.Reordered {
		if i < 5 {
			r.note("reordered %s user %s: WeChat index %d first handled after index %d", o.MsgID, o.User, o.Index, o.After)
		}
	}
	r.Kills = len(e.Kills)
	r.Failovers = len(e.Failovers)
	for _, f := range e.Failovers {
		// The bound dup_after_failover is held to: effects in the window.
		for _, d := range e.Deliveries {
			if f.covers(d.At, e.FailoverWindow) {
				r.FailoverWindowEffects++
			}
		}
	}
	r.Cuts = len(e.Cuts)
	for _, c := range e.Cuts {
		for _, d := range e.Deliveries {
			if d.Tag == c.Tag && (Failover{Issued: c.At, Done: c.At}).covers(d.At, e.FailoverWindow) {
				r.CutWindowEffects++
			}
		}
	}
	for _, c := range e.Crashes {
		r.Problem("daemon crash: %s", c)
	}
	if e.RepliesOn {
		e.judgeReplies(r, byMsg)
	}
	if stall, victims, ok := e.maxUserStall(); ok && !e.KillsNotForStalls {
		r.Extra("max_user_stall", stall.Round(100*time.Millisecond))
		if e.StallLimit > 0 && stall > e.StallLimit {
			r.Problem("max_user_stall %s after a consumer kill exceeds %s", stall.Round(100*time.Millisecond), e.StallLimit)
		}
		counts := make([]string, len(victims))
		for i, v := range victims {
			counts[i] = strconv.Itoa(v.users)
			if v.users == 0 {
				r.Problem("consumer kill %d (%s) found no user waiting on the victim: it tested no stall", i+1, v.tag)
			}
		}
		r.Extra("users_waiting_on_victim", strings.Join(counts, ","))
	}
	return r
}

// killVictims is, for one consumer kill, how many users were waiting on
// the victim.
type killVictims struct {
	tag   string
	users int
}

// maxUserStall is the longest time a user waited, after a consumer kill,
// for its next effect: for each kill K of a schedule-consumer, the users
// with a message sent before K that had no effect yet at K, and the time
// from K to their first effect after K. ok is false without consumer
// kills. A crashed consumer's users wait for the group to notice (the
// session timeout) and for the dead process's dedup claims to expire (the
// lease): this is the figure that shows both.
//
// victims counts, per kill, the users waiting on the victim: those waiting
// at K whose last effect before K the victim made (their partition was
// the victim's, as the Sink saw it). A kill with none tested no stall
// (a victim with no partitions yet, or nothing in flight).
func (e *Evidence) maxUserStall() (max time.Duration, victims []killVictims, ok bool) {
	var kills []Kill
	for _, k := range e.Kills {
		if strings.HasPrefix(k.Tag, "consumer") {
			kills = append(kills, k)
		}
	}
	if len(kills) == 0 {
		return 0, nil, false
	}
	first := map[string]time.Time{} // msgid → first effect
	byUser := map[string][]Delivery{}
	for _, d := range e.Deliveries {
		if t, seen := first[d.MsgID]; !seen || d.At.Before(t) {
			first[d.MsgID] = d.At
		}
		byUser[d.User] = append(byUser[d.User], d)
	}
	for _, ds := range byUser {
		sort.Slice(ds, func(i, j int) bool { return ds[i].At.Before(ds[j].At) })
	}
	for _, k := range kills {
		pending := map[string]bool{}
		for _, s := range e.Sent {
			if s.At.After(k.At) {
				continue
			}
			if t, seen := first[s.MsgID]; seen && !t.After(k.At) {
				continue
			}
			pending[s.User] = true
		}
		v := killVictims{tag: k.Tag}
		for u := range pending {
			ds := byUser[u]
			i := sort.Search(len(ds), func(i int) bool { return ds[i].At.After(k.At) })
			if i > 0 && ds[i-1].Tag == k.Tag {
				v.users++
			}
			if i == len(ds) {
				continue // nothing after the kill: counted as lost or dead-lettered
			}
			if d := ds[i].At.Sub(k.At); d > max {
				max = d
			}
		}
		victims = append(victims, v)
	}
	return max, victims, true
}

// judgeSent is e.Sent as the judge reads it.
func judgeSent(sent []Sent) []judge.Message {
	out := make([]judge.Message, len(sent))
	for i, s := range sent {
		out[i] = judge.Message{MsgID: s.MsgID, User: s.User, Index: s.Index, At: s.At}
	}
	return out
}

// judgeEffects is the Sink's deliveries as the judge reads them.
func judgeEffects(ds []Delivery) []judge.Effect {
	out := make([]judge.Effect, len(ds))
	for i, d := range ds {
		out[i] = judge.Effect{Seq: d.Seq, MsgID: d.MsgID, User: d.User, Tag: d.Tag, At: d.At}
	}
	return out
}

// dead is the set of msgids with a dead letter.
func (e *Evidence) dead() map[string]bool {
	out := make(map[string]bool, len(e.DLQ))
	for id, dl := range e.DLQ {
		if len(dl) > 0 {
			out[id] = true
		}
	}
	return out
}

func describeDeliveries(ds []Delivery) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%s@%s", d.Tag, d.At.Format("15:04:05.000"))
	}
	return strings.Join(parts, ", ")
}

// judgeReplies checks the replies the Sink asked for: every message with
// an effect got exactly one reply at the fake WeChat, with the msgid kfpipe
// derives for it (replies_missing); a repeat of a delivered msgid is
// explained only by a consumer kill within crashWindow after the reply
// (replies_dup counts the rest, replies_resent_after_kill the explained);
// and each user's replies reached WeChat in the order of the messages
// (replies_reordered).
func (e *Evidence) judgeReplies(r *Report, byMsg map[string][]Delivery) {
	sent := make(map[string]Sent, len(e.Sent))
	for _, s := range e.Sent {
		sent[s.MsgID] = s
	}
	got := map[string]wecomtest.Reply{}
	var strange int
	for _, rp := range e.Replies {
		var body struct {
			Content string `json:"content"`
		}
		_ = json.Unmarshal(rp.Body, &body)
		id, ok := strings.CutPrefix(body.Content, ReplyText(""))
		s, known := sent[id]
		if !ok || !known || rp.MsgID != kf.MsgID(s.OpenKfID, id, 0) || rp.User != s.User {
			strange++
			r.note("reply not asked for: %+v", rp)
			continue
		}
		if _, twice := got[id]; twice {
			strange++ // the fake delivers a msgid once: a second reply had another msgid
			r.note("second reply with another msgid to %s", id)
		}
		got[id] = rp
	}
	missing := 0
	for id := range byMsg {
		if _, ok := got[id]; !ok {
			missing++
			if missing <= 5 {
				r.note("no reply to %s user %s", id, sent[id].User)
			}
		}
	}
	var consumerKills []time.Time
	for _, k := range e.Kills {
		if strings.HasPrefix(k.Tag, "consumer") {
			consumerKills = append(consumerKills, k.At)
		}
	}
	dup, resent := 0, 0
	for _, d := range e.ReplyDups {
		first, ok := e.replyByMsgID(d.MsgID)
		explained := false
		for _, at := range consumerKills {
			// As with effects: a reply the fake stamped after the kill was
			// a request the killed consumer had written before it died
			// (a CI run saw four stamped 100-185 ms after the kill).
			explained = explained || ok && !at.Before(first.At.Add(-e.inFlight())) && at.Sub(first.At) <= e.crashWindow()
		}
		if explained {
			resent++
		} else {
			dup++
			r.note("reply sent twice: msgid %s user %s first %s again %s", d.MsgID, d.User,
				first.At.Format("15:04:05.000"), d.At.Format("15:04:05.000"))
		}
	}
	reordered := 0
	last := map[string]int{} // user → index of the message of its last reply
	for _, rp := range e.Replies {
		var body struct {
			Content string `json:"content"`
		}
		_ = json.Unmarshal(rp.Body, &body)
		s, ok := sent[strings.TrimPrefix(body.Content, ReplyText(""))]
		if !ok {
			continue
		}
		if prev, seen := last[s.User]; seen && s.Index < prev && len(e.DLQ[s.MsgID]) == 0 {
			reordered++
			r.note("reply to message %d of user %s after the reply to message %d", s.Index, s.User, prev)
		}
		last[s.User] = max(last[s.User], s.Index)
	}
	r.Extra("replies", len(e.Replies))
	r.Extra("replies_missing", missing)
	r.Extra("replies_dup", dup)
	r.Extra("replies_resent_after_kill", resent)
	r.Extra("replies_reordered", reordered)
	if missing+dup+reordered+strange > 0 {
		r.Problem("replies: %d missing, %d sent twice outside the crash window, %d out of order, %d not asked for",
			missing, dup, reordered, strange)
	}
}

// replyByMsgID returns the delivered reply with WeChat msgid id.
func (e *Evidence) replyByMsgID(id string) (wecomtest.Reply, bool) {
	for _, rp := range e.Replies {
		if rp.MsgID == id {
			return rp, true
		}
	}
	return wecomtest.Reply{}, false
}
