package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

func fullNemesisConfig() NemesisConfig {
	return NemesisConfig{Duration: 30 * time.Minute, Warmup: 5 * time.Second, Consumers: 3, Users: 600,
		Lease: 10 * time.Second, Full: true, Kinds: AllKinds(), GapLo: 2 * time.Second, GapHi: 12 * time.Second,
		MaxConsumersDown: 2, Brokers: 3}
}

// Two runs of one seed print the same schedule: the generator is a pure
// function of the seed and the configuration.
func TestNemesisScheduleReplaysFromItsSeed(t *testing.T) {
	cfg := fullNemesisConfig()
	a, b := GenSchedule(12345, cfg).String(), GenSchedule(12345, cfg).String()
	if a != b {
		t.Fatalf("one seed, two schedules:\n%s\n---\n%s", a, b)
	}
	if !strings.HasPrefix(a, "nemesis schedule seed=12345 ") {
		t.Fatalf("the schedule does not name its seed first: %q", a[:80])
	}
	if c := GenSchedule(12346, cfg).String(); c == a {
		t.Fatal("seeds 12345 and 12346 gave the same schedule")
	}
}

// The full schedule (make chaos) has at least 200 faults of at least 15
// kinds in 30 minutes, for every seed tried, and never holds one resource
// twice at once nor disturbs more consumers at once than allowed.
func TestNemesisFullScheduleSize(t *testing.T) {
	cfg := fullNemesisConfig()
	for seed := uint64(1); seed <= 50; seed++ {
		s := GenSchedule(seed, cfg)
		if len(s.Steps) < 200 || len(s.Kinds()) < 15 {
			t.Errorf("seed %d: %d steps of %d kinds, want ≥ 200 of ≥ 15", seed, len(s.Steps), len(s.Kinds()))
		}
		for i, st := range s.Steps {
			if st.At < cfg.Warmup || st.End() > cfg.Duration {
				t.Errorf("seed %d: step outside the run: %s", seed, st)
			}
			if i > 0 && st.At < s.Steps[i-1].At {
				t.Errorf("seed %d: steps out of order at %s", seed, st)
			}
			down := 0
			for _, o := range s.Steps[:i] {
				if o.Target == "" || o.End()+3*time.Second <= st.At {
					continue
				}
				// partitions-added restarts every daemon: nothing else
				// may hold one meanwhile.
				if (o.Target == "all") != (st.Target == "all") && (daemonTarget(o.Target) || daemonTarget(st.Target)) {
					t.Errorf("seed %d: %s overlaps %s", seed, st, o)
				}
				if o.Target == st.Target {
					t.Errorf("seed %d: %s overlaps %s on one target", seed, st, o)
				}
				if strings.HasPrefix(o.Target, "consumer-") && o.Target != "consumer-4" {
					down++
				}
			}
			if strings.HasPrefix(st.Target, "consumer-") && st.Target != "consumer-4" && down >= cfg.MaxConsumersDown {
				t.Errorf("seed %d: %s disturbs a consumer while %d others are", seed, st, down)
			}
		}
	}
	seed, scfg, err := NemesisPlan(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if seed != 48 || scfg.Duration != 3*time.Minute {
		t.Errorf("make test's nemesis: seed %d for %s, want 48 for 3m", seed, scfg.Duration)
	}
	short := GenSchedule(seed, scfg)
	for _, st := range short.Steps {
		if st.Kind == SlowHandler && st.Arg > 3000 {
			t.Errorf("the short schedule has a handler of %d ms", st.Arg)
		}
	}
	if len(short.Steps) < 8 {
		t.Errorf("the short schedule has %d steps:\n%s", len(short.Steps), short)
	}
}

func TestParseKinds(t *testing.T) {
	ks, err := ParseKinds("consumer-kill9, flood")
	if err != nil || len(ks) != 2 || ks[0] != ConsumerKill9 || ks[1] != Flood {
		t.Fatalf("ParseKinds: %v %v", ks, err)
	}
	if _, err := ParseKinds("consumer-kill9,nope"); err == nil {
		t.Fatal("an unknown kind was accepted")
	}
}

// The checker counts what the schedule does not explain: a letter for a
// reason no step causes, a wait longer than the steps explain, a reply
// twice, a reply missing — and lets pass what it does explain.
func TestNemesisCheckerJudges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	sent := []Sent{
		{MsgID: "m1", User: "u1", Index: 0, At: t0},
		{MsgID: "m2", User: "u1", Index: 1, At: t0.Add(time.Second)},
		{MsgID: "m3", User: "u2", Index: 0, At: t0},                // failed for u2: letter explained
		{MsgID: "m4", User: "u3", Index: 0, At: t0},                // letter no step explains
		{MsgID: "m5", User: "u4", Index: 0, At: t0},                // waited 2 min: too long
		{MsgID: "m6", User: "u5", Index: 0, At: t0},                // held by a servicer: no reply
		{MsgID: "m7", User: "bot", Index: 0, At: t0},               // the flooder waits as long as it likes
		{MsgID: "m8", User: "u6", Index: 0, At: t0.Add(time.Hour)}, // waited 60 s during a kill: explained
	}
	dels := []Delivery{
		{MsgID: "m1", User: "u1", Tag: "consumer-1.1", At: t0.Add(time.Second)},
		{MsgID: "m2", User: "u1", Tag: "consumer-1.1", At: t0.Add(2 * time.Second)},
		{MsgID: "m5", User: "u4", Tag: "consumer-1.1", At: t0.Add(2 * time.Minute)},
		{MsgID: "m6", User: "u5", Tag: "consumer-1.1", At: t0.Add(time.Second)},
		{MsgID: "m7", User: "bot", Tag: "consumer-1.1", At: t0.Add(5 * time.Minute)},
		{MsgID: "m8", User: "u6", Tag: "consumer-1.1", At: t0.Add(time.Hour + 60*time.Second)},
	}
	// u7 writes 7 messages at once: WeChat takes 5 replies, refuses 2.
	t2 := t0.Add(2 * time.Hour)
	for i := range 7 {
		id := fmt.Sprintf("q%d", i)
		sent = append(sent, Sent{MsgID: id, User: "u7", Index: i, At: t2})
		dels = append(dels, Delivery{MsgID: id, User: "u7", Tag: "consumer-1.1", At: t2.Add(time.Duration(i+1) * 100 * time.Millisecond)})
	}
	ev := &Evidence{Sent: sent, Deliveries: dels, Lease: 10 * time.Second, Kafka: map[string]int{},
		DLQ: map[string][]DeadLetter{
			"m3": {{MsgID: "m3", User: "u2", Reason: "downstream_error"}},
			"m4": {{MsgID: "m4", User: "u3", Reason: "invalid_message"}},
		}}
	rep := ev.Report("t", time.Minute)
	reply := func(id, msgid string, at time.Time) wecomtest.Reply {
		body, _ := json.Marshal(map[string]string{"content": ReplyText(id)})
		return wecomtest.Reply{MsgID: msgid, Body: body, At: at}
	}
	replies := []wecomtest.Reply{reply("m1", "r1", t0), reply("m2", "r2", t0), reply("m5", "r5", t0),
		reply("m7", "r7", t0), reply("m8", "r8", t0)}
	for i := range 5 {
		rp := reply(fmt.Sprintf("q%d", i), fmt.Sprintf("rq%d", i), t2.Add(time.Duration(i+1)*100*time.Millisecond+time.Millisecond))
		rp.User = "u7"
		replies = append(replies, rp)
	}
	// WeChat's record of the two it refused (95001).
	for i := 5; i < 7; i++ {
		rp := reply(fmt.Sprintf("q%d", i), fmt.Sprintf("rq%d", i), t2.Add(time.Second))
		rp.User = "u7"
		ev.ReplyRefusals = append(ev.ReplyRefusals, wecomtest.Refusal{Reply: rp, Errcode: 95001})
	}
	dups := []wecomtest.Reply{{MsgID: "r1", User: "u1", At: t0.Add(time.Minute)}}
	run := NemesisRun{BaseStall: 30 * time.Second, Flooders: map[string]bool{"bot": true}, Applied: []Applied{
		{Step: Step{Kind: FailUser}, User: "u2", Start: t0, End: t0.Add(5 * time.Second)},
		{Step: Step{Kind: ReplyServicer}, User: "u5", Start: t0, End: t0.Add(5 * time.Second)},
		{Step: Step{Kind: ConsumerKill9, Target: "consumer-1"}, Start: t0.Add(time.Hour + time.Second),
			End: t0.Add(time.Hour + 5*time.Second)},
	}}
	v := Check(ev, rep, replies, dups, run)
	if v.LettersUnexplained != 1 || v.StallsOver != 1 || v.Blocked != 1 || v.RepliesDup != 1 || v.RepliesMissing != 0 ||
		v.Lost != 0 || v.Dup != 0 || v.Reordered != 0 || v.RepliesRefusedQuota != 2 {
		t.Fatalf("verdict %s; violations %q", v.Line(), v.Violations)
	}
	if v.OK() {
		t.Fatal("a run with violations was judged clean")
	}
	if !strings.HasPrefix(v.Line(), "lost=0 dup=0 reordered=0 replies_dup=1 ") {
		t.Fatalf("verdict line %q", v.Line())
	}
	// Without WeChat's refusals, the two replies missing are violations.
	refusals := ev.ReplyRefusals
	ev.ReplyRefusals = nil
	if v := Check(ev, rep, replies, dups, run); v.RepliesMissing != 2 || v.RepliesRefusedQuota != 0 {
		t.Fatalf("missing replies %d, refused %d, want 2 and 0: %q", v.RepliesMissing, v.RepliesRefusedQuota, v.Violations)
	}
	ev.ReplyRefusals = refusals
	// Without the servicer's hold, m6's missing reply is a violation.
	run.Applied = run.Applied[:1]
	if v := Check(ev, rep, replies, dups, run); v.RepliesMissing != 1 {
		t.Fatalf("missing replies %d, want 1: %q", v.RepliesMissing, v.Violations)
	}
	// A daemon that does not exit cleanly on SIGTERM is a finding.
	run.Applied = append(run.Applied, Applied{Step: Step{Kind: ConsumerRestart, Target: "consumer-1"},
		Finding: "SIGTERM: exit status 1"})
	if v := Check(ev, rep, replies, dups, run); v.ShutdownFailures != 1 || v.OK() {
		t.Fatalf("shutdown failures %d, want 1", v.ShutdownFailures)
	}
}

// daemonTarget: a step's target is one of the daemons.
func daemonTarget(target string) bool {
	return strings.HasPrefix(target, "consumer-") || target == "producer" || target == "dlq"
}

// The replay command a run prints gives the same schedule again: its
// assignments, read back as the environment, plan the same seed and
// configuration (for make test's fixed seed, a full run's fresh one, and a
// minimized schedule's kinds and duration), and it runs through make
// chaos, whose go test timeout leaves room for a 30-minute schedule.
func TestNemesisReplayCommandReplays(t *testing.T) {
	envs := []map[string]string{
		{},
		{EnvFull: "1"},
		{EnvFull: "1", EnvNemesisSeed: "5", EnvNemesisKinds: "scale-out,receiver-slow", EnvNemesisDuration: "2m"},
		{EnvNemesisSeed: "7", EnvNemesisKafka: "shared"},
		{EnvFull: "1", EnvNemesisRedis: "sentinel", EnvNemesisDuration: "10m"},
	}
	for _, e := range envs {
		seed, cfg, err := NemesisPlan(func(k string) string { return e[k] })
		if err != nil {
			t.Fatal(err)
		}
		cmd := ReplayCommand("TestChaosNemesis", seed, cfg.Full, func(k string) string { return e[k] })
		if !strings.HasSuffix(cmd, " CHAOS_RUN='^TestChaosNemesis$' make chaos") {
			t.Errorf("replay %q: not one make chaos run of exactly the test", cmd)
		}
		replayed := map[string]string{}
		for _, f := range strings.Fields(cmd) {
			if k, v, ok := strings.Cut(f, "="); ok {
				replayed[k] = strings.Trim(v, "'")
			}
		}
		seed2, cfg2, err := NemesisPlan(func(k string) string { return replayed[k] })
		if err != nil {
			t.Fatalf("replay %q: %v", cmd, err)
		}
		if a, b := GenSchedule(seed, cfg).String(), GenSchedule(seed2, cfg2).String(); a != b {
			t.Errorf("env %v, replay %q: another schedule:\n%s\n---\n%s", e, cmd, a, b)
		}
	}
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "chaos.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`go test -v -run "\$run" -count=1 -timeout (\d+)m`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/chaos.sh: no go test -timeout for the scenarios")
	}
	if n, _ := strconv.Atoi(string(m[1])); time.Duration(n)*time.Minute < 2*30*time.Minute {
		t.Errorf("scripts/chaos.sh gives go test %sm: a 30-minute nemesis, its start and its settling need more", m[1])
	}
}

// On Redis Sentinel the schedule fails the primary over and leaves out
// the fault proxy's kinds; elsewhere it never draws a failover.
func TestNemesisSentinelKinds(t *testing.T) {
	for _, redisMode := range []string{"", "sentinel"} {
		env := map[string]string{EnvFull: "1", EnvNemesisRedis: redisMode, EnvNemesisDuration: "10m", EnvNemesisSeed: "9"}
		seed, cfg, err := NemesisPlan(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		ks := GenSchedule(seed, cfg).Kinds()
		if got := ks[SentinelFailover] > 0; got != (redisMode == "sentinel") {
			t.Errorf("redis %q: %d sentinel failovers", redisMode, ks[SentinelFailover])
		}
		for k := range proxyKinds {
			if redisMode == "sentinel" && ks[k] > 0 {
				t.Errorf("on Sentinel the schedule has %d %s", ks[k], k)
			}
		}
	}
}
