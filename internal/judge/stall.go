package judge

import (
	"sort"
	"time"
)

// Stall is the longest a user waited with nothing happening.
type Stall struct {
	User  string
	Wait  time.Duration
	Since time.Time // when the wait began
}

// MaxUserStall is the longest time any user had a message waiting (sent
// and not yet handled) while none of the user's messages was handled: for
// each effect of a user, the time since the later of the user's previous
// effect and the send time of the user's oldest message still waiting
// then. A message that was dead-lettered and never handled left the user's
// stream (it does not wait); one that was dead-lettered and later handled
// (recovered) waited until it was. The wait after a user's last effect is
// not counted: a message still waiting at the end is lost, and reported
// as that. Send and effect times must come from comparable clocks.
func MaxUserStall(sent []Message, effects []Effect, dead map[string]bool) Stall {
	first := map[string]time.Time{}
	byUser := map[string][]time.Time{}
	for _, e := range effects {
		if t, ok := first[e.MsgID]; !ok || e.At.Before(t) {
			first[e.MsgID] = e.At
		}
		byUser[e.User] = append(byUser[e.User], e.At)
	}
	// waiting per user: the messages that can wait, by first effect (never
	// handled last), with the suffix minimum of their send times.
	type waiting struct {
		first   time.Time
		handled bool
		sentAt  time.Time
	}
	perUser := map[string][]waiting{}
	for _, s := range sent {
		t, handled := first[s.MsgID]
		if !handled && dead[s.MsgID] {
			continue
		}
		perUser[s.User] = append(perUser[s.User], waiting{first: t, handled: handled, sentAt: s.At})
	}
	var worst Stall
	for user, ws := range perUser {
		sort.Slice(ws, func(i, j int) bool {
			if ws[i].handled != ws[j].handled {
				return ws[i].handled
			}
			return ws[i].first.Before(ws[j].first)
		})
		suffixMin := make([]time.Time, len(ws)+1)
		for i := len(ws) - 1; i >= 0; i-- {
			suffixMin[i] = ws[i].sentAt
			if i+1 < len(ws) && suffixMin[i+1].Before(suffixMin[i]) {
				suffixMin[i] = suffixMin[i+1]
			}
		}
		ts := byUser[user]
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		var prev time.Time // zero: before the first effect
		for _, t := range ts {
			// The messages still waiting just after prev: first effect
			// after prev (or none).
			i := sort.Search(len(ws), func(i int) bool { return !ws[i].handled || ws[i].first.After(prev) })
			if i < len(ws) {
				since := suffixMin[i]
				if since.Before(prev) {
					since = prev
				}
				if d := t.Sub(since); d > worst.Wait {
					worst = Stall{User: user, Wait: d, Since: since}
				}
			}
			prev = t
		}
	}
	return worst
}
