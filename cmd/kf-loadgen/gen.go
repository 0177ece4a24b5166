package main

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// gapDist is a distribution of time gaps: "exp:2s" (exponential, mean
// 2 s), "uniform:1s-5s" or "fixed:2s".
type gapDist struct {
	kind     string
	a, b     time.Duration
	original string
}

func parseGap(s string) (gapDist, error) {
	kind, arg, ok := strings.Cut(s, ":")
	bad := func(why string) (gapDist, error) {
		return gapDist{}, fmt.Errorf("--gap %q: %s (want exp:MEAN, uniform:MIN-MAX or fixed:D, e.g. exp:2s)", s, why)
	}
	if !ok {
		return bad("no distribution")
	}
	g := gapDist{kind: kind, original: s}
	var err error
	switch kind {
	case "exp", "fixed":
		if g.a, err = time.ParseDuration(arg); err != nil || g.a < 0 {
			return bad("not a duration >= 0")
		}
	case "uniform":
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return bad("uniform needs MIN-MAX")
		}
		if g.a, err = time.ParseDuration(lo); err != nil || g.a < 0 {
			return bad("MIN is not a duration >= 0")
		}
		if g.b, err = time.ParseDuration(hi); err != nil || g.b < g.a {
			return bad("MAX is not a duration >= MIN")
		}
	default:
		return bad("unknown distribution " + strconv.Quote(kind))
	}
	return g, nil
}

func (g gapDist) mean() time.Duration {
	if g.kind == "uniform" {
		return (g.a + g.b) / 2
	}
	return g.a
}

func (g gapDist) draw(r *rand.Rand) time.Duration {
	switch g.kind {
	case "exp":
		return time.Duration(r.ExpFloat64() * float64(g.a))
	case "uniform":
		return g.a + time.Duration(r.Int64N(int64(g.b-g.a)+1))
	}
	return g.a
}

// burstRange is how many messages a conversation has: "1-5" or "3".
type burstRange struct{ lo, hi int }

func parseBurst(s string) (burstRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || a < 1 || b < a {
		return burstRange{}, fmt.Errorf("--burst %q: want N or MIN-MAX with 1 <= MIN <= MAX", s)
	}
	return burstRange{a, b}, nil
}

func (b burstRange) mean() float64 { return float64(b.lo+b.hi) / 2 }

// conversations schedules users the way people write: each user sends
// conversations of burst messages separated by gap, with pauses between
// conversations drawn (exponentially) so that the user's average rate is
// perUserMin. A pause is at least one mean gap.
type conversations struct {
	r     *rand.Rand
	burst burstRange
	gap   gapDist
	pause time.Duration // mean pause between conversations
	q     userQueue
}

// newConversations schedules users from start for a run of length run.
func newConversations(users int, perUserMin float64, burst burstRange, gap gapDist, start time.Time, run time.Duration, seed uint64) *conversations {
	c := &conversations{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), burst: burst, gap: gap}
	cycle := time.Duration(burst.mean() * float64(time.Minute) / perUserMin)
	c.pause = max(cycle-time.Duration((burst.mean()-1)*float64(gap.mean())), gap.mean())
	// Users start at random points of their cycle, not all at once; in a
	// run shorter than two cycles, within its first half, so that every
	// user of a short smoke test sends.
	spread := cycle
	if run > 0 {
		spread = min(spread, run/2)
	}
	for u := range users {
		c.q = append(c.q, &userState{user: u, next: start.Add(time.Duration(c.r.Int64N(int64(spread) + 1))),
			left: c.drawBurst()})
	}
	heap.Init(&c.q)
	return c
}

func (c *conversations) drawBurst() int { return c.burst.lo + c.r.IntN(c.burst.hi-c.burst.lo+1) }

// due returns the users (indexes, a user possibly more than once, in
// order) with a message due at or before now, with the time each was due.
func (c *conversations) due(now time.Time, fn func(user int, at time.Time)) {
	for len(c.q) > 0 && !c.q[0].next.After(now) {
		u := c.q[0]
		fn(u.user, u.next)
		u.left--
		if u.left > 0 {
			u.next = u.next.Add(c.gap.draw(c.r))
		} else {
			u.left = c.drawBurst()
			u.next = u.next.Add(time.Duration(c.r.ExpFloat64() * float64(c.pause)))
		}
		heap.Fix(&c.q, 0)
	}
}

type userState struct {
	user int
	next time.Time
	left int // messages left in the current conversation
}

type userQueue []*userState

func (q userQueue) Len() int           { return len(q) }
func (q userQueue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }
func (q userQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *userQueue) Push(x any)        { *q = append(*q, x.(*userState)) }
func (q *userQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
