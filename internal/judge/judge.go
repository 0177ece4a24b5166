// Package judge decides, from what was sent and what reached the business
// side, whether a pipeline kept its promises: nothing lost, no second
// effect, every user's messages handled in order. The chaos suite and
// kf-loadgen's check judge with it, so a figure of one means what the same
// figure of the other means.
package judge

import (
	"sort"
	"time"
)

// Message is one message sent into the pipeline.
type Message struct {
	MsgID string
	User  string
	Index int       // position in the user's order (what "in order" means)
	At    time.Time // when it was sent
}

// Effect is one handler call that reached the business side.
type Effect struct {
	Seq   int // order of arrival
	MsgID string
	User  string
	Tag   string // who made it (a consumer incarnation), when known
	At    time.Time
}

// Cause says why a message had more than one effect. A message with
// several repeats takes the worst cause of them (the highest value).
type Cause int

const (
	// Crash: the effect before the repeat was made just before its process
	// was killed (at-least-once window: its done mark was never written).
	Crash Cause = iota + 1
	// Failover: the done mark of the effect before was lost with a Redis
	// primary.
	Failover
	// Late: one of the two effects was made after its caller had given
	// up on it (the receiver answered past the caller's timeout, or
	// finished a call the caller cancelled at a hand-over): the earlier
	// one, so the caller could not know it happened and called again; or
	// the later one, a call cancelled before the next owner's that the
	// receiver finished after it. A receiver that does not dedup (by the
	// Idempotency-Key or the fencing token) sees two messages.
	Late
	// Unexplained: a duplicate effect, the pipeline's fault.
	Unexplained
)

// Input is what a run is judged on.
type Input struct {
	Sent    []Message
	Effects []Effect        // any order; Seq gives the arrival order
	Dead    map[string]bool // msgids with a dead letter
	// Explain says why effect prev can have been followed by next, another
	// of the same message; nil treats every repeat as Unexplained.
	Explain func(prev, next Effect) Cause
}

// Repeat is a sent message with more than one effect.
type Repeat struct {
	MsgID   string
	User    string
	Effects []Effect // in arrival order
	Cause   Cause
}

// Reorder is a message whose first effect came after the first effect of
// a later message of the same user.
type Reorder struct {
	MsgID string
	User  string
	Index int // its index
	After int // the highest index handled before it
}

// Verdict is the judgement of an Input.
type Verdict struct {
	Effects   int // distinct sent messages with at least one effect
	Dead      int // distinct sent messages with a dead letter
	Recovered int // of those, the ones that also had an effect
	Lost      []Message
	Repeats   []Repeat
	Reordered []Reorder
	Unknown   []Effect // first effect of each msgid never sent
	// ByMsg is every sent message's effects in arrival order.
	ByMsg map[string][]Effect
}

// Count is the number of repeats whose cause is c.
func (v *Verdict) Count(c Cause) int {
	n := 0
	for _, r := range v.Repeats {
		if r.Cause == c {
			n++
		}
	}
	return n
}

// Dup is the number of messages with an unexplained second effect.
func (v *Verdict) Dup() int { return v.Count(Unexplained) }

// OK reports whether nothing was lost, duplicated or reordered and no
// effect was of a message never sent.
func (v *Verdict) OK() bool {
	return len(v.Lost) == 0 && v.Dup() == 0 && len(v.Reordered) == 0 && len(v.Unknown) == 0
}

// Judge computes the verdict. lost: sent, no effect and no dead letter.
// A repeat (second or later effect) takes the worst Explain cause of the
// effects before it. reordered: per user, a first effect that comes after
// the first effect of a message later in the user's order; messages that
// went through the DLQ are left out (they leave the order with a recorded
// reason, I4) and so are messages without an effect.
func Judge(in Input) *Verdict {
	v := &Verdict{ByMsg: map[string][]Effect{}}
	sent := make(map[string]Message, len(in.Sent))
	for _, s := range in.Sent {
		sent[s.MsgID] = s
	}
	effects := append([]Effect(nil), in.Effects...)
	sort.SliceStable(effects, func(i, j int) bool { return effects[i].Seq < effects[j].Seq })
	unknown := map[string]bool{}
	for _, e := range effects {
		if _, ok := sent[e.MsgID]; !ok {
			if !unknown[e.MsgID] {
				unknown[e.MsgID] = true
				v.Unknown = append(v.Unknown, e)
			}
			continue
		}
		v.ByMsg[e.MsgID] = append(v.ByMsg[e.MsgID], e)
	}
	for _, s := range in.Sent {
		es := v.ByMsg[s.MsgID]
		if len(es) > 0 {
			v.Effects++
		}
		if in.Dead[s.MsgID] {
			v.Dead++
			if len(es) > 0 {
				v.Recovered++
			}
		}
		if len(es) == 0 && !in.Dead[s.MsgID] {
			v.Lost = append(v.Lost, s)
		}
		if len(es) > 1 {
			worst := Cause(0)
			for i := 1; i < len(es); i++ {
				c := Unexplained
				if in.Explain != nil {
					c = in.Explain(es[i-1], es[i])
				}
				worst = max(worst, c)
			}
			v.Repeats = append(v.Repeats, Repeat{MsgID: s.MsgID, User: s.User, Effects: es, Cause: worst})
		}
	}
	v.Reordered = reordered(in.Sent, v.ByMsg, in.Dead)
	return v
}

func reordered(sent []Message, byMsg map[string][]Effect, dead map[string]bool) []Reorder {
	perUser := map[string][]Message{}
	var users []string
	for _, s := range sent {
		if dead[s.MsgID] || len(byMsg[s.MsgID]) == 0 {
			continue
		}
		if _, ok := perUser[s.User]; !ok {
			users = append(users, s.User)
		}
		perUser[s.User] = append(perUser[s.User], s)
	}
	var out []Reorder
	for _, user := range users {
		msgs := perUser[user]
		sort.SliceStable(msgs, func(i, j int) bool { return byMsg[msgs[i].MsgID][0].Seq < byMsg[msgs[j].MsgID][0].Seq })
		maxIdx := -1
		for _, s := range msgs {
			if s.Index < maxIdx {
				out = append(out, Reorder{MsgID: s.MsgID, User: user, Index: s.Index, After: maxIdx})
				continue
			}
			maxIdx = s.Index
		}
	}
	return out
}
