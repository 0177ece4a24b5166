package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// Scenario is the scripted traffic, after the user profiles of the design
// (normal, excited, bot) plus a downstream failing for some users and then
// fixed, a downstream outage for everybody, a WeChat re-delivery and a
// flash crowd. Times are from the scenario's start.
type Scenario struct {
	Accounts int // open_kfids the users are spread over

	// Normal customers: MsgsPerUser messages each, the first within
	// Spread, then one every GapMin..GapMax. A gap above 10 s / 3 keeps
	// each user at ≤ 3 messages per 10 s window of the normal group (5),
	// leaving room for one re-delivered and one recovered message.
	Users          int
	MsgsPerUser    int
	Spread         time.Duration
	GapMin, GapMax time.Duration

	// Excited user: a human's bursts (a dozen messages within seconds, a
	// few times an hour: eight photos, a question pasted line by line).
	// The shipped limiter rules must let them through.
	Excited []Burst

	// Failing downstream: from FailAt for FailFor the business's
	// downstream fails for FailUsers users (fewer than the gate's
	// outage.min_users, so it is their problem, not an outage): each of
	// them sends FailMsgs messages FailGap apart from FailAt (during the
	// other users' traffic: failures of more than one user making up
	// half of the handler's recent calls make the gate suspect an outage
	// and hold them), which are
	// dead-lettered as downstream_error and brought back by the DLQ
	// scheduler once the downstream is fixed. FailFor below the demo's
	// recovery.base_delay (recoveryBase) makes every letter come due
	// after the fix: none is retried into the failure, so each user's
	// letters come back together, in order.
	FailUsers, FailMsgs int
	FailAt, FailFor     time.Duration
	FailGap             time.Duration

	// Bot: BotRate messages/s for BotFor from BotAt ⇒ rate_limited until
	// the penalty threshold, then user_blocked for the block time.
	BotAt   time.Duration
	BotRate int
	BotFor  time.Duration

	// Outage: the business handler fails everything for OutageFor; the
	// consumer's downstream gate holds the messages meanwhile.
	OutageAt  time.Duration
	OutageFor time.Duration

	// Re-delivery: at RedeliverAt, WeChat hands out again RedeliverN
	// messages first sent in [RedeliverFrom, RedeliverTo) (same msgid),
	// as after a lost cursor; the consumer's dedup must recognise them.
	RedeliverAt, RedeliverFrom, RedeliverTo time.Duration
	RedeliverN                              int

	// Crowd: CrowdUsers new users send one message each at CrowdAt (a
	// campaign everybody answers at once).
	CrowdAt    time.Duration
	CrowdUsers int
}

// Burst is a run of N messages from one user, spread evenly over Over
// (100 ms apart when Over is 0).
type Burst struct {
	At   time.Duration
	N    int
	Over time.Duration
}

// gap is the time between two messages of the burst.
func (b Burst) gap() time.Duration {
	if b.Over <= 0 || b.N < 2 {
		return 100 * time.Millisecond
	}
	return b.Over / time.Duration(b.N-1)
}

// FullScenario is what `make demo` runs: about 3,600 messages in 30 s.
func FullScenario() Scenario {
	return Scenario{
		Accounts: 2,
		Users:    300, MsgsPerUser: 6, Spread: 4 * time.Second, GapMin: 4200 * time.Millisecond, GapMax: 5500 * time.Millisecond,
		Excited:   []Burst{{At: 2 * time.Second, N: 12, Over: 2 * time.Second}, {At: 22 * time.Second, N: 12, Over: 2 * time.Second}},
		FailUsers: 8, FailMsgs: 4, FailAt: 3 * time.Second, FailFor: 3800 * time.Millisecond, FailGap: 800 * time.Millisecond,
		BotAt: 8 * time.Second, BotRate: 50, BotFor: 4 * time.Second,
		OutageAt: 13 * time.Second, OutageFor: 3 * time.Second,
		RedeliverAt: 10 * time.Second, RedeliverFrom: 3 * time.Second, RedeliverTo: 7 * time.Second, RedeliverN: 30,
		CrowdAt: 24 * time.Second, CrowdUsers: 1500,
	}
}

// ShortScenario is the same story in about 10 s, for tests.
func ShortScenario() Scenario {
	return Scenario{
		Accounts: 2,
		Users:    60, MsgsPerUser: 3, Spread: 3 * time.Second, GapMin: 4200 * time.Millisecond, GapMax: 5 * time.Second,
		Excited:   []Burst{{At: time.Second, N: 12, Over: 2 * time.Second}, {At: 5 * time.Second, N: 12, Over: 2 * time.Second}},
		FailUsers: 2, FailMsgs: 3, FailAt: 500 * time.Millisecond, FailFor: 3 * time.Second, FailGap: time.Second,
		BotAt: 3 * time.Second, BotRate: 50, BotFor: 2 * time.Second,
		OutageAt: 8 * time.Second, OutageFor: 2 * time.Second,
		RedeliverAt: 5 * time.Second, RedeliverFrom: time.Second, RedeliverTo: 4 * time.Second, RedeliverN: 10,
		CrowdAt: 9 * time.Second, CrowdUsers: 200,
	}
}

// Bot and excited user IDs; failingPrefix starts the IDs of the users
// whose downstream fails.
const (
	botUser       = "demo-bot"
	excitedUser   = "demo-excited"
	failingPrefix = "demo-failing-"
)

func failingUser(i int) string { return fmt.Sprintf("%s%04d", failingPrefix, i) }

type evKind int

const (
	evMessage evKind = iota
	evRedeliver
	evOutageOn
	evOutageOff
	evFailOn
	evFailOff
)

type event struct {
	at   time.Duration
	kind evKind
	user string
	ref  int // evMessage: index into plan.msgs; evRedeliver: the message re-delivered
}

// planned is one message of the plan; id is filled
// when it is added to the fake WeChat.
type planned struct {
	user, account, text string
	userSeq             int // position in the user's own sequence
	id                  string
}

type plan struct {
	events   []event
	msgs     []planned
	accounts []string
	duration time.Duration
}

func accountName(i int) string { return fmt.Sprintf("wk-demo-%d", i+1) }

// build turns the scenario into a time-ordered event list, deterministic
// for a seed.
func (s Scenario) build(seed uint64) *plan {
	rng := rand.New(rand.NewPCG(seed, 0x6b66706970650a))
	p := &plan{}
	for i := range max(s.Accounts, 1) {
		p.accounts = append(p.accounts, accountName(i))
	}
	userSeq := map[string]int{}
	add := func(at time.Duration, user string, account int) {
		i := len(p.msgs)
		n := userSeq[user]
		userSeq[user]++
		p.msgs = append(p.msgs, planned{user: user, account: p.accounts[account%len(p.accounts)],
			text: fmt.Sprintf("%s message %d", user, n+1), userSeq: n})
		p.events = append(p.events, event{at: at, kind: evMessage, user: user, ref: i})
	}
	for u := range s.Users {
		user := fmt.Sprintf("demo-user-%04d", u)
		at := time.Duration(rng.Int64N(int64(max(s.Spread, 1))))
		for range s.MsgsPerUser {
			add(at, user, u)
			at += s.GapMin + time.Duration(rng.Int64N(int64(max(s.GapMax-s.GapMin, 1))))
		}
	}
	for _, b := range s.Excited {
		for k := range b.N {
			add(b.At+time.Duration(k)*b.gap(), excitedUser, 0)
		}
	}
	if s.FailUsers > 0 && s.FailFor > 0 {
		// The failing users take turns, so their failures are spread
		// among the other users' successes: bunched together they
		// would look like the start of an outage to the consumer's
		// gate, which then holds them instead of dead-lettering them.
		for u := range s.FailUsers {
			at := s.FailAt + time.Duration(u)*s.FailGap/time.Duration(s.FailUsers)
			for range s.FailMsgs {
				add(at, failingUser(u), u)
				at += s.FailGap
			}
		}
		p.events = append(p.events, event{at: s.FailAt, kind: evFailOn},
			event{at: s.FailAt + s.FailFor, kind: evFailOff})
	}
	if s.BotRate > 0 {
		step := time.Second / time.Duration(s.BotRate)
		for at := s.BotAt; at < s.BotAt+s.BotFor; at += step {
			add(at, botUser, 1)
		}
	}
	for u := range s.CrowdUsers {
		add(s.CrowdAt+time.Duration(u%50)*time.Millisecond, fmt.Sprintf("demo-crowd-%04d", u), u)
	}
	if s.OutageFor > 0 {
		p.events = append(p.events, event{at: s.OutageAt, kind: evOutageOn},
			event{at: s.OutageAt + s.OutageFor, kind: evOutageOff})
	}
	// Re-deliver normal users' messages only: theirs were handled before
	// the outage, so the copies must all be recognised as duplicates.
	if s.RedeliverN > 0 {
		var cands []int
		for _, e := range p.events {
			if e.kind == evMessage && e.at >= s.RedeliverFrom && e.at < s.RedeliverTo &&
				profileOf(e.user) == "normal" {
				cands = append(cands, e.ref)
			}
		}
		rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		for _, ref := range cands[:min(s.RedeliverN, len(cands))] {
			p.events = append(p.events, event{at: s.RedeliverAt, kind: evRedeliver, ref: ref})
		}
	}
	sort.SliceStable(p.events, func(i, j int) bool { return p.events[i].at < p.events[j].at })
	for _, e := range p.events {
		p.duration = max(p.duration, e.at)
	}
	return p
}

// driver plays a plan against the fake WeChat: appends the messages to
// the account's log and sends the signed, encrypted kf_msg_or_event
// callback, as WeChat does when users write.
type driver struct {
	plan   *plan
	fake   *wecomtest.Server
	sender *wecomtest.CallbackSender
	rec    *recorder

	mu        sync.Mutex
	added     int
	redeliver int
	cbErrors  int
	cbSent    int
}

// tick is how often the driver wakes; WeChat too coalesces a user's
// messages into fewer callbacks than messages.
const tick = 20 * time.Millisecond

func (d *driver) run(ctx context.Context, start time.Time) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	next := 0
	for next < len(d.plan.events) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		el := time.Since(start)
		touched := map[string]bool{}
		for next < len(d.plan.events) && d.plan.events[next].at <= el {
			d.apply(d.plan.events[next], touched)
			next++
		}
		for _, acc := range d.plan.accounts {
			if touched[acc] {
				d.notify(ctx, acc)
			}
		}
	}
	return nil
}

func (d *driver) apply(e event, touched map[string]bool) {
	switch e.kind {
	case evOutageOn:
		d.rec.outageOn()
	case evOutageOff:
		d.rec.outageOff()
	case evFailOn:
		d.rec.failOn()
	case evFailOff:
		d.rec.failOff()
	case evMessage:
		m := &d.plan.msgs[e.ref]
		m.id = d.fake.AddText(m.account, m.user, m.text)
		touched[m.account] = true
		d.mu.Lock()
		d.added++
		d.mu.Unlock()
	case evRedeliver:
		m := &d.plan.msgs[e.ref]
		if m.id == "" {
			return
		}
		// The same item WeChat handed out before: same msgid, same
		// send_time, same content.
		for _, old := range d.fake.Messages(m.account) {
			if old.UpstreamMsgID == m.id {
				d.fake.Append(m.account, old.Content)
				touched[m.account] = true
				d.mu.Lock()
				d.redeliver++
				d.mu.Unlock()
				break
			}
		}
	}
}

func (d *driver) notify(ctx context.Context, account string) {
	tok := d.fake.IssueToken(account)
	resp, err := d.sender.SendEvent(ctx, account, tok)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cbSent++
	if err != nil {
		d.cbErrors++
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		d.cbErrors++
	}
}

func (d *driver) counts() (added, redelivered, callbacks, callbackErrors int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.added, d.redeliver, d.cbSent, d.cbErrors
}
