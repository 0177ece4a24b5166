package ratelimit

import (
	"iter"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

const ok = "" // Decision.Reason of an allowed message

// step is one message of a timeline.
type step struct {
	at       time.Duration // since T0
	want     string        // ok, ReasonRateLimited or ReasonUserBlocked
	viol     int           // Decision.Violations; -1 = not checked
	newBlock bool
	until    time.Duration // for blocked decisions: the block end since T0
}

// repeat yields n identical steps.
func repeat(n int, s step) iter.Seq[step] {
	return func(yield func(step) bool) {
		for range n {
			if !yield(s) {
				return
			}
		}
	}
}

func concat(seqs ...iter.Seq[step]) iter.Seq[step] {
	return func(yield func(step) bool) {
		for _, s := range seqs {
			for st := range s {
				if !yield(st) {
					return
				}
			}
		}
	}
}

// every yields one message per interval from start (inclusive) to end
// (exclusive), each decided by f(i, at).
func every(start, end, interval time.Duration, f func(i int, at time.Duration) step) iter.Seq[step] {
	return func(yield func(step) bool) {
		for i, at := 0, start; at < end; i, at = i+1, at+interval {
			s := f(i, at)
			s.at = at
			if !yield(s) {
				return
			}
		}
	}
}

// seedCase is one of the seed's rate-limit scenarios: a user's messages
// with their send times and the expected decisions.
type seedCase struct {
	name    string
	steps   iter.Seq[step]
	blockAt time.Duration // -1: never blocked
}

// seedCases are the four attack scenarios of the design's rate-limiting
// rules (normal, excited, bot, slow attack) plus the boundary, each with
// "10 seconds 5 messages, 3 violations block for 1 hour".
func seedCases() []seedCase {
	const bot = 10 * time.Millisecond // 100 msg/s
	const slow = 1900 * time.Millisecond
	botBlock := 7*bot + time.Hour    // the 8th message (T0.07) blocks
	slowBlock := 17*slow + time.Hour // the 18th message (T32.3) blocks
	return []seedCase{
		{
			// 场景1 正常用户: 1-2 messages a minute never meet the limit.
			name: "normal user",
			steps: concat(
				repeat(1, step{at: 0, want: ok, viol: 0}),
				repeat(1, step{at: 5 * time.Second, want: ok, viol: 0}),  // T0-T10: 2
				repeat(1, step{at: 15 * time.Second, want: ok, viol: 0}), // T10-T20: 1
				every(time.Minute, 24*time.Hour, 40*time.Second, func(int, time.Duration) step { return step{want: ok, viol: 0} }),
			),
			blockAt: -1,
		},
		{
			// 场景2 激动用户: a burst, two refusals, calm: the window slides and
			// the violations reset.
			name: "excited user",
			steps: concat(
				repeat(5, step{at: 0, want: ok, viol: 0}),                              // T0: 1-5 pass
				repeat(1, step{at: 1 * time.Second, want: ReasonRateLimited, viol: 1}), // T1: 6th, 1/3
				repeat(1, step{at: 2 * time.Second, want: ReasonRateLimited, viol: 2}), // T2: 7th, 2/3
				repeat(1, step{at: 11 * time.Second, want: ok, viol: 0}),               // T11: 8th passes, reset
				// The reset is real: the next refusal is 1/3, not 3/3 (a block).
				repeat(4, step{at: 11 * time.Second, want: ok, viol: 0}),
				repeat(1, step{at: 11 * time.Second, want: ReasonRateLimited, viol: 1}),
			),
			blockAt: -1,
		},
		{
			// 场景3 机器人攻击: 100 msg/s. 5 pass, the next 3 are refused, the
			// 3rd refusal blocks for 1h, and every message of that hour is
			// refused as user_blocked; the first after it passes.
			name: "bot at 100 msg/s",
			steps: concat(
				every(0, botBlock+6*bot, bot, func(i int, at time.Duration) step {
					switch {
					case i < 5:
						return step{want: ok, viol: 0}
					case i < 7:
						return step{want: ReasonRateLimited, viol: i - 4}
					case i == 7:
						return step{want: ReasonRateLimited, viol: 3, newBlock: true, until: botBlock}
					case at < botBlock:
						return step{want: ReasonUserBlocked, viol: 0, until: botBlock}
					case i < 7+int(time.Hour/bot)+5:
						return step{want: ok, viol: 0} // the block ended: a fresh window
					default:
						return step{want: ReasonRateLimited, viol: 1} // and a fresh count
					}
				}),
			),
			blockAt: 7 * bot,
		},
		{
			// 场景4 慢速攻击: "every 2 s" is exactly the limit (a timestamp
			// leaves the window when it is N seconds old), so "just above the
			// limit" is one message every 1.9 s. Refusals come at T9.5 (1/3),
			// T20.9 (2/3) and T32.3 (3/3): blocked around T30, as designed.
			name: "slow attack",
			steps: every(0, slowBlock+slow, slow, func(i int, at time.Duration) step {
				switch {
				case i == 5:
					return step{want: ReasonRateLimited, viol: 1}
				case i == 11:
					return step{want: ReasonRateLimited, viol: 2}
				case i == 17:
					return step{want: ReasonRateLimited, viol: 3, newBlock: true, until: slowBlock}
				case i > 17 && at < slowBlock:
					return step{want: ReasonUserBlocked, viol: 0, until: slowBlock}
				case i > 17:
					return step{want: ok, viol: -1}
				default:
					return step{want: ok, viol: -1}
				}
			}),
			blockAt: 17 * slow,
		},
		{
			// The boundary of 场景4: exactly one message per 2 s for a day is
			// never refused.
			name: "exactly at the limit",
			steps: every(0, 24*time.Hour, 2*time.Second, func(int, time.Duration) step {
				return step{want: ok, viol: 0}
			}),
			blockAt: -1,
		},
	}
}

func TestSeedScenarios(t *testing.T) { eachStore(t, eachSeedScenarios) }

func eachSeedScenarios(t *testing.T, store *Store) {
	cases := seedCases()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			clock := newFakeClock()
			l := newLimiter(t, seedConfig(), store, WithClock(clock), WithRegisterer(reg))
			user := "u-" + tc.name
			n, refused := 0, 0
			for s := range tc.steps {
				now := t0.Add(s.at)
				d := l.Allow(bg, user, now)
				n++
				if d.Reason != s.want || d.Allowed != (s.want == ok) || d.NewBlock != s.newBlock || d.Group != "normal" {
					t.Fatalf("message %d at T+%s: got %+v, want reason %q newBlock %v", n, s.at, d, s.want, s.newBlock)
				}
				if s.viol >= 0 && d.Violations != s.viol {
					t.Fatalf("message %d at T+%s: violations %d, want %d", n, s.at, d.Violations, s.viol)
				}
				if s.until != 0 && !d.BlockedUntil.Equal(t0.Add(s.until)) {
					t.Fatalf("message %d at T+%s: blocked until %s, want T+%s", n, s.at, d.BlockedUntil, s.until)
				}
				if !d.Allowed {
					refused++
				}
			}
			t.Logf("%d messages, %d refused", n, refused)
			got := testenv.MetricValue(l.m.decisions.WithLabelValues(resultAllowed))
			if int(got) != n-refused {
				t.Errorf("allowed counter %v, want %d", got, n-refused)
			}
			if tc.blockAt < 0 {
				if v := testenv.MetricValue(l.m.blocks.WithLabelValues("normal")); v != 0 {
					t.Errorf("users_blocked_total = %v, want 0", v)
				}
				return
			}
			if v := testenv.MetricValue(l.m.blocks.WithLabelValues("normal")); v != 1 {
				t.Errorf("users_blocked_total = %v, want 1", v)
			}
			if v := testenv.MetricValue(l.m.violations.WithLabelValues("normal")); v < 3 {
				t.Errorf("violations_total = %v, want >= 3", v)
			}
			// The block is in Redis with TTL = the block and its end as value.
			until := t0.Add(tc.blockAt + time.Hour).UnixMilli()
			testenv.Eventually(t, 2*time.Second, func() error {
				return testenv.Check(store.rdb.Exists(bg, store.blockKey(user)).Val() == 1, "block written")
			})
			if v := store.rdb.Get(bg, store.blockKey(user)).Val(); v != strconv.FormatInt(until, 10) {
				t.Errorf("%s = %q, want %d", store.blockKey(user), v, until)
			}
			if ttl := store.rdb.PTTL(bg, store.blockKey(user)).Val(); ttl > time.Hour || ttl < time.Hour-10*time.Second {
				t.Errorf("block TTL %s, want ~1h", ttl)
			}
			if sc := store.rdb.ZScore(bg, store.blockedKey(), user).Val(); int64(sc) != until {
				t.Errorf("rl:blocked score %v, want %d", sc, until)
			}
		})
	}
}

// The reset rule: after an allowed message, a window of at most X/2
// messages clears the violations; a fuller window keeps them.
func TestViolationReset(t *testing.T) {
	l := newLimiter(t, seedConfig(), nil)
	steps := []struct {
		at   time.Duration
		want string
		viol int
	}{
		{0, ok, 0}, {1 * time.Second, ok, 0}, {2 * time.Second, ok, 0}, {3 * time.Second, ok, 0}, {4 * time.Second, ok, 0},
		{4500 * time.Millisecond, ReasonRateLimited, 1},
		{11500 * time.Millisecond, ok, 1}, // window 2s,3s,4s +1 = 4 > 2: kept
		{13500 * time.Millisecond, ok, 1}, // window 4s,11.5s +1 = 3 > 2: kept
		{21600 * time.Millisecond, ok, 0}, // window 13.5s +1 = 2 <= 2: reset
		{21600 * time.Millisecond, ok, 0}, {21600 * time.Millisecond, ok, 0}, {21600 * time.Millisecond, ok, 0},
		{21600 * time.Millisecond, ReasonRateLimited, 1},
		// A timestamp exactly N seconds old has left the window.
		{23500 * time.Millisecond, ok, 1}, // 13.5s is out: 21.6 x4 +1 = 5 > 2: kept
		{31600 * time.Millisecond, ok, 0}, // all 21.6s are out: 23.5 +1 = 2: reset
	}
	for i, s := range steps {
		d := l.Allow(bg, "u", t0.Add(s.at))
		if d.Reason != s.want || d.Violations != s.viol {
			t.Fatalf("step %d at T+%s: got %q violations %d, want %q %d", i, s.at, d.Reason, d.Violations, s.want, s.viol)
		}
	}
}

// Groups: vip is looser, suspicious stricter, whitelist unlimited; a
// group set in Redis applies to a new user at once and to a known one
// through the event.
func TestGroups(t *testing.T) { eachStore(t, eachGroups) }

func eachGroups(t *testing.T, store *Store) {
	clock := newFakeClock()
	cfg := seedConfig()
	l := newLimiter(t, cfg, store, WithClock(clock))
	a := newAdmin(t, cfg, store, clock)
	for user, g := range map[string]string{"vip": "vip", "sus": "suspicious"} {
		if err := a.SetGroup(bg, user, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Whitelist(bg, "wl"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetGroup(bg, "x", "platinum"); err == nil {
		t.Fatal("SetGroup accepted an unknown group")
	}

	check := func(user string, n int, want string, viol int, newBlock bool, group string, until time.Duration) {
		t.Helper()
		for i := range n {
			d := l.Allow(bg, user, t0)
			if d.Reason != want || d.Group != group || (viol >= 0 && d.Violations != viol+i) || d.NewBlock != (newBlock && i == n-1) {
				t.Fatalf("%s message %d: got %+v, want %q group %s", user, i, d, want, group)
			}
			if d.NewBlock && !d.BlockedUntil.Equal(t0.Add(until)) {
				t.Fatalf("%s blocked until %s, want T+%s", user, d.BlockedUntil, until)
			}
		}
	}
	// vip: 20 per 10 s; the 10th violation blocks for 30 minutes.
	check("vip", 20, ok, -1, false, "vip", 0)
	check("vip", 9, ReasonRateLimited, 1, false, "vip", 0)
	check("vip", 1, ReasonRateLimited, 10, true, "vip", 30*time.Minute)
	check("vip", 1, ReasonUserBlocked, -1, false, "vip", 0)
	// suspicious: 3 per 30 s; the first violation blocks for 24 h.
	check("sus", 3, ok, -1, false, "suspicious", 0)
	check("sus", 1, ReasonRateLimited, 1, true, "suspicious", 24*time.Hour)
	// whitelist: never limited.
	check("wl", 20000, ok, -1, false, "whitelist", 0)
	// default group: normal.
	check("plain", 5, ok, -1, false, "normal", 0)
	check("plain", 1, ReasonRateLimited, 1, false, "normal", 0)

	// A known user moved to vip live: the event reaches the cached state.
	if err := a.SetGroup(bg, "plain", "vip"); err != nil {
		t.Fatal(err)
	}
	took := testenv.Eventually(t, time.Second, func() error {
		st := l.lookup("plain")
		st.mu.Lock()
		defer st.mu.Unlock()
		return testenv.Check(st.group == "vip", "group event applied: group %q, want vip", st.group)
	})
	t.Logf("group change applied after %s", took)
	check("plain", 15, ok, -1, false, "vip", 0)
	// Back to the default group: the ring shrinks to 5 keeping the newest.
	if err := a.SetGroup(bg, "plain", "normal"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() error {
		st := l.lookup("plain")
		st.mu.Lock()
		defer st.mu.Unlock()
		return testenv.Check(st.group == "", "group event applied: group %q, want none", st.group)
	})
	check("plain", 1, ReasonRateLimited, -1, false, "normal", 0)
	if err := a.RemoveWhitelist(bg, "plain"); err == nil {
		t.Error("RemoveWhitelist of a non-whitelisted user succeeded")
	}
	if err := a.RemoveWhitelist(bg, "wl"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() error {
		return testenv.Check(l.Allow(bg, "wl", t0).Reason == ReasonRateLimited, "whitelist removed")
	})
}

// Blocks live in Redis: a second node (or a restart) sees them, and an
// operator's unblock, block and rules change on a third reach both within a
// second.
func TestBlockSharedAcrossNodes(t *testing.T) { eachStore(t, eachBlockSharedAcrossNodes) }

func eachBlockSharedAcrossNodes(t *testing.T, store *Store) {
	clock := newFakeClock()
	cfg := seedConfig()
	nodeA := newLimiter(t, cfg, store, WithClock(clock))
	nodeB := newLimiter(t, cfg, store, WithClock(clock))
	admin := newAdmin(t, cfg, store, clock)

	var last Decision
	for i := range 8 {
		last = nodeA.Allow(bg, "bot", t0.Add(time.Duration(i)*10*time.Millisecond))
	}
	if !last.NewBlock {
		t.Fatalf("8th message did not block: %+v", last)
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		st, err := admin.Status(bg, "bot")
		return testenv.Check(err == nil && st.Blocked, "block written")
	})
	st, _ := admin.Status(bg, "bot")
	if !st.BlockedUntil.Equal(last.BlockedUntil) || st.Permanent || st.Group != "normal" {
		t.Fatalf("status %+v, want blocked until %s", st, last.BlockedUntil)
	}
	later := t0.Add(time.Minute)
	if d := nodeB.Allow(bg, "bot", later); d.Reason != ReasonUserBlocked || !d.BlockedUntil.Equal(last.BlockedUntil) {
		t.Fatalf("node B: %+v, want user_blocked until %s", d, last.BlockedUntil)
	}
	clock.Set(later)
	list, next, err := admin.ListBlocked(bg, 0, 10)
	if err != nil || next != 0 || len(list) != 1 || list[0].User != "bot" || !list[0].BlockedUntil.Equal(last.BlockedUntil) {
		t.Fatalf("ListBlocked = %+v, %d, %v", list, next, err)
	}

	if err := admin.Unblock(bg, "bot"); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*Limiter{"A": nodeA, "B": nodeB} {
		took := testenv.Eventually(t, time.Second, func() error {
			return testenv.Check(l.Allow(bg, "bot", later).Allowed, "%s", "unblock on node "+name)
		})
		t.Logf("unblock reached node %s after %s", name, took)
	}

	// A permanent block by an operator.
	if err := admin.Block(bg, "bot", 0); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() error {
		d := nodeB.Allow(bg, "bot", later.Add(100*24*time.Hour))
		return testenv.Check(d.Reason == ReasonUserBlocked && d.Permanent, "permanent block on node B")
	})
	if ttl := store.rdb.PTTL(bg, store.blockKey("bot")).Val(); ttl != -1 {
		t.Errorf("permanent block has TTL %s", ttl)
	}
	// An automatic block never shortens an operator's permanent one.
	for i := range 8 {
		nodeA.Allow(bg, "bot2", t0.Add(time.Duration(i)*time.Millisecond))
	}
	if err := admin.Block(bg, "bot3", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.writeBlocks(bg, []blockWrite{{user: "bot", until: later.UnixMilli() + 1000, ttlMs: 1000, nowMs: later.UnixMilli()}}); err != nil {
		t.Fatal(err)
	}
	if st, _ := admin.Status(bg, "bot"); !st.Permanent {
		t.Errorf("automatic block replaced a permanent one: %+v", st)
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		list, _, err := admin.ListBlocked(bg, 0, 10)
		return testenv.Check(err == nil && len(list) == 3, "three users listed: %d (%v)", len(list), err)
	})
	page1, next, _ := admin.ListBlocked(bg, 0, 2)
	page2, next2, _ := admin.ListBlocked(bg, next, 2)
	if len(page1) != 2 || next != 2 || len(page2) != 1 || next2 != 0 || !page2[0].Permanent || page2[0].User != "bot" {
		t.Errorf("pages %+v (next %d) %+v (next %d): want the permanent block last", page1, next, page2, next2)
	}
	// Expired blocks are pruned from the listing.
	clock.Set(t0.Add(3 * time.Hour))
	if list, _, _ := admin.ListBlocked(bg, 0, 10); len(list) != 1 || list[0].User != "bot" {
		t.Errorf("after expiry ListBlocked = %+v, want only the permanent block", list)
	}

	// Rules changed by an operator reach every node.
	rules := seedConfig().Groups
	normal := rules["normal"]
	normal.MaxMessages = 2
	rules["normal"] = normal
	if err := admin.SetRules(bg, rules); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*Limiter{"A": nodeA, "B": nodeB} {
		took := testenv.Eventually(t, time.Second, func() error {
			return testenv.Check(l.rules.Load().lookup("normal").max == 2, "%s", "rules on node "+name)
		})
		t.Logf("rules reached node %s after %s", name, took)
		at := t0.Add(5 * time.Hour)
		user := "fresh-" + name
		if d1, d2, d3 := l.Allow(bg, user, at), l.Allow(bg, user, at), l.Allow(bg, user, at); !d1.Allowed || !d2.Allowed || d3.Reason != ReasonRateLimited {
			t.Errorf("node %s with 2/10s: %+v %+v %+v", name, d1, d2, d3)
		}
	}
	bad := seedConfig().Groups
	delete(bad, "normal")
	if err := admin.SetRules(bg, bad); err == nil {
		t.Error("SetRules accepted rules without the default group")
	}
	if err := admin.ResetRules(bg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() error { return testenv.Check(nodeB.rules.Load().lookup("normal").max == 5, "rules reset") })

	// A node started later (a restart) picks the block up from Redis.
	nodeC := newLimiter(t, cfg, store, WithClock(clock))
	if d := nodeC.Allow(bg, "bot3", t0.Add(time.Minute)); d.Reason != ReasonUserBlocked {
		t.Errorf("restarted node: %+v, want user_blocked", d)
	}
}

// Progressive penalty: 1h, 2h, 4h … capped, counted over the history
// window, and carried across nodes through Redis.
func TestProgressivePenalty(t *testing.T) { eachStore(t, eachProgressivePenalty) }

func eachProgressivePenalty(t *testing.T, store *Store) {
	clock := newFakeClock()
	cfg := seedConfig()
	cfg.Progressive.Enabled = true
	cfg.Progressive.Max = 5 * time.Hour
	nodeA := newLimiter(t, cfg, store, WithClock(clock))
	nodeB := newLimiter(t, cfg, store, WithClock(clock))

	at := t0
	attack := func(l *Limiter) time.Duration {
		t.Helper()
		var d Decision
		for i := range 8 {
			d = l.Allow(bg, "bot", at.Add(time.Duration(i)*10*time.Millisecond))
		}
		if !d.NewBlock {
			t.Fatalf("attack at %s did not block: %+v", at, d)
		}
		blockedAt := at.Add(70 * time.Millisecond)
		at = d.BlockedUntil.Add(time.Second)
		return d.BlockedUntil.Sub(blockedAt)
	}
	want := []time.Duration{time.Hour, 2 * time.Hour, 4 * time.Hour}
	for i, w := range want {
		if got := attack(nodeA); got != w {
			t.Fatalf("block %d lasted %s, want %s", i+1, got, w)
		}
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		return testenv.Check(store.rdb.ZCard(bg, store.historyKey("bot")).Val() == 3, "history written: %d entries, want 3", store.rdb.ZCard(bg, store.historyKey("bot")).Val())
	})
	// The user moves to node B (rebalance): the history comes along.
	nodeA.Forget("bot")
	for i, w := range []time.Duration{5 * time.Hour, 5 * time.Hour} {
		if got := attack(nodeB); got != w {
			t.Fatalf("block %d on node B lasted %s, want %s (capped)", i+4, got, w)
		}
	}
	// A day without blocks: back to the base.
	at = at.Add(25 * time.Hour)
	if got := attack(nodeB); got != time.Hour {
		t.Fatalf("block after a quiet day lasted %s, want 1h", got)
	}
	// A stricter group keeps its own longer block.
	admin := newAdmin(t, cfg, store, clock)
	if err := admin.SetGroup(bg, "sus", "suspicious"); err != nil {
		t.Fatal(err)
	}
	var d Decision
	for range 4 {
		d = nodeB.Allow(bg, "sus", at)
	}
	if !d.NewBlock || d.BlockedUntil.Sub(at) != 24*time.Hour {
		t.Fatalf("suspicious with progressive: %+v, want a 24h block", d)
	}
}

func TestDisabledAllowsEverything(t *testing.T) {
	cfg := seedConfig()
	cfg.Enabled = false
	l := newLimiter(t, cfg, nil)
	for i := range 100 {
		if d := l.Allow(bg, "u", t0); !d.Allowed {
			t.Fatalf("message %d refused with the limiter disabled: %+v", i, d)
		}
	}
}

func TestInvalidConfigNamesKey(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*config.RateLimit)
		key    string
	}{
		{"unknown default", func(c *config.RateLimit) { c.DefaultGroup = "gold" }, "rate_limit.default_group"},
		{"zero max", func(c *config.RateLimit) { g := c.Groups["vip"]; g.MaxMessages = 0; c.Groups["vip"] = g }, "rate_limit.groups.vip.max_messages"},
		{"zero window", func(c *config.RateLimit) {
			g := c.Groups["normal"]
			g.WindowSeconds = 0
			c.Groups["normal"] = g
		}, "rate_limit.groups.normal.window_seconds"},
		{"negative block", func(c *config.RateLimit) {
			g := c.Groups["normal"]
			g.BlockHours = -1
			c.Groups["normal"] = g
		}, "rate_limit.groups.normal.block_hours"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := seedConfig()
			tc.mutate(&cfg)
			_, err := New(cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("New error %v, want one naming %s", err, tc.key)
			}
		})
	}
}

// Many users decided in parallel while events arrive: run under -race.
func TestConcurrentUsersAndEvents(t *testing.T) {
	l := newLimiter(t, seedConfig(), nil)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				user := "u" + strconv.Itoa(w*10+i%10)
				l.Allow(bg, user, t0.Add(time.Duration(i)*time.Millisecond))
				if i%500 == 0 {
					l.Forget(user)
				}
			}
		}()
	}
	for i := range 200 {
		user := "u" + strconv.Itoa(i%80)
		l.apply(event{Op: []string{opBlock, opUnblock, opGroup}[i%3], User: user, Group: "vip", Until: t0.UnixMilli() + 10})
	}
	wg.Wait()
}

// TestSeedScenariosAsBacklog replays the seed's scenarios as a backlog: all
// five users' messages interleaved by send time and decided while the
// limiter's clock runs 50 times slower than the send times (a consumer
// catching up). Every decision must be the one the scenario expects when
// the messages arrive live: the bot and the slow attacker are blocked, the
// others never are. The limiter counts by the send time it is given; the
// clock only sets how long Redis keeps a block.
func TestSeedScenariosAsBacklog(t *testing.T) {
	type ev struct {
		user string
		c    int
		s    step
	}
	cases := seedCases()
	var evs []ev
	for i, tc := range cases {
		for s := range tc.steps {
			evs = append(evs, ev{user: "b-" + tc.name, c: i, s: s})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].s.at < evs[j].s.at })
	reg := prometheus.NewRegistry()
	clock := newFakeClock()
	l := newLimiter(t, seedConfig(), redisStore(t), WithClock(clock), WithRegisterer(reg))
	blocked := map[string]bool{}
	for n, e := range evs {
		clock.Set(t0.Add(e.s.at / 50))
		d := l.Allow(bg, e.user, t0.Add(e.s.at))
		if d.Reason != e.s.want || d.NewBlock != e.s.newBlock {
			t.Fatalf("event %d, %s at T+%s: got %+v, want reason %q newBlock %v", n, e.user, e.s.at, d, e.s.want, e.s.newBlock)
		}
		if d.NewBlock {
			blocked[cases[e.c].name] = true
		}
	}
	for _, tc := range cases {
		if blocked[tc.name] != (tc.blockAt >= 0) {
			t.Errorf("%s: blocked=%v, want %v", tc.name, blocked[tc.name], tc.blockAt >= 0)
		}
	}
	if v := testenv.MetricValue(l.m.blocks.WithLabelValues("normal")); v != 2 {
		t.Errorf("users_blocked_total = %v, want 2 (the bot and the slow attacker)", v)
	}
}
