package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosNemesis runs the nemesis: a seeded random schedule of faults
// and routine events (GenSchedule) over traffic of several shapes, judged
// by one checker over the whole run (Check). The seed and the schedule are
// printed before the run; a failure prints the first violations with the
// seed and the command that replays it.
//
// make test runs a short schedule (3 minutes of faults, the kinds today's code
// survives: ShortKinds); make chaos runs 30 minutes of every kind
// (KFPIPE_NEMESIS_DURATION changes it, KFPIPE_NEMESIS_KINDS restricts the
// kinds, KFPIPE_NEMESIS_SEED replays a seed).
//
// Traffic: dense (random customers of a pool at a steady rate),
// conversation-paced (customers writing every few seconds), write-once
// (a new customer, one message), and from the schedule a flooding bot and
// a human's burst. The receiver takes 1–20 ms a message, more when the
// schedule slows it (for everyone, or one customer's handler up to 30 s in
// the full run), and answers each message with a reply.
func TestChaosNemesis(t *testing.T) { runNemesis(t, "nemesis") }

// TestChaosNemesisRollingRestartSlowBot (full suite only) is the nemesis's
// first finding kept as a fixed schedule: seed 21 of consumer-restart and
// slow-handler, 2 minutes — rolling SIGTERMs while one customer's handler
// takes up to 30 s. On the code of its day a stopping consumer exited 1
// after 8 s (3 of 8 stops) and 3 messages reached the receiver twice, the
// second call starting while the first ran at the previous owner (issue
// 43, items 1 and 8).
func TestChaosNemesisRollingRestartSlowBot(t *testing.T) {
	SkipUnlessFull(t)
	t.Setenv(EnvNemesisSeed, "21")
	t.Setenv(EnvNemesisDuration, "2m")
	t.Setenv(EnvNemesisKinds, "consumer-restart,slow-handler")
	runNemesis(t, "nemesis-rolling-restart-slow-bot")
}

// TestChaosNemesisScaleOutSlowReceiver (full suite only): the nemesis's
// finding in a sample of every kind (seed 5), minimized to seed 5 of
// scale-out and receiver-slow, 2 minutes — a consumer joins and leaves
// while the receiver answers in up to 20 s. On the code of its day 72
// messages reached the receiver twice (the joining consumer called the
// receiver for messages whose first call still ran at the consumer that
// gave the partition up) and both stops of the spare exited 1 after 8 s
// (issue 43, items 1 and 8).
func TestChaosNemesisScaleOutSlowReceiver(t *testing.T) {
	SkipUnlessFull(t)
	t.Setenv(EnvNemesisSeed, "5")
	t.Setenv(EnvNemesisDuration, "2m")
	t.Setenv(EnvNemesisKinds, "scale-out,receiver-slow")
	runNemesis(t, "nemesis-scale-out-slow-receiver")
}

// TestChaosNemesisPartitionsAdded (full suite only): the finding of the
// partitions-added kind, kept as a fixed schedule — seed 3 of
// partitions-added, consumer-kill9 and receiver-slow, 2 minutes. Found by
// seed 3 of those kinds and layout-change at the reduced size, whose four
// layout-change steps were not carried out (the kind's first form): the
// runbook's kf-producer, restarted with 8 partitions, wrote 3 messages
// again (its re-pull from the saved cursor); 2 of them, of customers who
// moved, took effect and were answered twice (dup=2 replies_dup=2). The
// consumer that read them had read the topic's partition-count history
// (one count) less than 10 s before and kept it, so it never asked the
// partition the customer had. Fixed by state.RecordPartitionCount: a
// daemon started with a new count waits until every store's history holds
// it (TestPartitionCountKnownAfterTheWait).
func TestChaosNemesisPartitionsAdded(t *testing.T) {
	SkipUnlessFull(t)
	t.Setenv(EnvNemesisSeed, "3")
	t.Setenv(EnvNemesisDuration, "2m")
	t.Setenv(EnvNemesisKinds, "partitions-added,consumer-kill9,receiver-slow")
	runNemesis(t, "nemesis-partitions-added")
}

// TestChaosNemesisSentinel (full suite only): the nemesis on Redis
// Sentinel — every kind but the fault proxy's (a Sentinel client follows
// the address the sentinels name), and the primary killed with SIGKILL and
// brought back as the replica, again and again (sentinel-failover). 10
// minutes; KFPIPE_NEMESIS_REDIS=sentinel runs any schedule there.
func TestChaosNemesisSentinel(t *testing.T) {
	SkipUnlessFull(t)
	t.Setenv(EnvNemesisRedis, "sentinel")
	if os.Getenv(EnvNemesisDuration) == "" {
		t.Setenv(EnvNemesisDuration, "10m")
	}
	runNemesis(t, "nemesis-sentinel")
}

// runNemesis is the nemesis run, its schedule from the environment
// (EnvNemesisSeed, EnvNemesisDuration, EnvNemesisKinds, EnvNemesisKafka).
func runNemesis(t *testing.T, name string) {
	svc := NeedServices(t)
	full := Full()
	seed, cfg, err := NemesisPlan(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	duration, brokers := cfg.Duration, cfg.Brokers
	const consumers = 3
	users := cfg.Users
	sched := GenSchedule(seed, cfg)
	replay := ReplayCommand(t.Name(), seed, full, os.Getenv)
	fmt.Print(sched.String())
	fmt.Printf("nemesis: replay with %s\n", replay)
	t.Logf("nemesis seed=%d steps=%d kinds=%s", seed, len(sched.Steps), sched.KindCounts())

	kafkaAddr := svc.Brokers
	var cluster *Cluster
	consumerEnv := map[string]string{}
	var commonEnv map[string]string
	if brokers > 0 {
		cluster = PrivateKafkaCluster(t)
		kafkaAddr = cluster.Brokers
		commonEnv = map[string]string{
			"KFPIPE_KAFKA_TOPICS_MAIN_REPLICATION_FACTOR":  "3",
			"KFPIPE_KAFKA_TOPICS_MAIN_MIN_INSYNC_REPLICAS": "2",
			"KFPIPE_KAFKA_TOPICS_DLQ_REPLICATION_FACTOR":   "3",
			"KFPIPE_KAFKA_TOPICS_DLQ_MIN_INSYNC_REPLICAS":  "2",
		}
	}
	fp := StartFaultProxy(t)
	links := map[string]*toxiclient.Proxy{}
	for i := 1; i <= consumers+1; i++ {
		name := "consumer-" + strconv.Itoa(i)
		links[name] = fp.Link(t, "nemesis-redis-"+name+"-"+strconv.FormatUint(seed, 10)+"-"+strconv.Itoa(rand.IntN(1e6)), svc.Redis)
	}
	if full {
		// Handlers up to 30 s: the receiver's timeout and the attempt's
		// must let them finish.
		consumerEnv["KFPIPE_HANDLER_HTTP_TIMEOUT"] = "45s"
		consumerEnv["KFPIPE_PROCESSOR_ATTEMPT_TIMEOUT"] = "45s"
	}
	var (
		runMu    sync.Mutex
		applied  []Applied
		flooders = map[string]bool{}
	)
	var pp *Pipeline
	judge := func(ev *Evidence, rep *Report) {
		runMu.Lock()
		defer runMu.Unlock()
		// The Sink's replies are switched on after the start, so the
		// evidence did not read the fake's: WeChat's refusals explain a
		// missing reply (95001).
		ev.ReplyRefusals = pp.Fake.Refusals()
		v := Check(ev, rep, pp.Fake.Replies("", ""), pp.Fake.Duplicates(), NemesisRun{Schedule: sched, Applied: applied,
			Flooders: flooders, BaseStall: Size(30*time.Second, 30*time.Second)})
		line := fmt.Sprintf("nemesis seed=%d verdict: %s", seed, v.Line())
		t.Log(line)
		fmt.Println(line)
		if path := os.Getenv(EnvReport); path != "" {
			if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				_, _ = fmt.Fprintln(f, line)
				_ = f.Close()
			}
		}
		rep.Extra("seed", seed)
		rep.Extra("faults", len(applied)-countFailed(applied))
		rep.Extra("steps_failed", countFailed(applied))
		rep.Extra("fault_kinds", len(v.FaultsByKind))
		rep.Extra("replies", v.Replies)
		rep.Extra("replies_dup", v.RepliesDup)
		rep.Extra("letters_unexplained", v.LettersUnexplained)
		rep.Extra("blocked", v.Blocked)
		rep.Extra("max_stall", v.MaxStall.Round(100*time.Millisecond))
		failed := 0
		for _, a := range applied {
			if a.Err != "" {
				failed++
				if failed <= 5 {
					t.Logf("nemesis step not carried out: %s: %s", a.Step, a.Err)
				}
			}
		}
		if !v.OK() {
			var b strings.Builder
			fmt.Fprintf(&b, "nemesis seed=%d: %d violations; the first:\n", seed, len(v.Violations))
			for i, s := range v.Violations {
				if i == 10 {
					break
				}
				fmt.Fprintf(&b, "  %s\n", s)
			}
			fmt.Fprintf(&b, "replay: %s\n%s", replay, sched.String())
			fmt.Print(b.String())
			rep.Problem("nemesis checker: %s", b.String())
		}
		if full && duration >= 30*time.Minute {
			if len(applied)-failed < 200 || len(v.FaultsByKind) < 15 {
				rep.Problem("the full nemesis injected %d faults of %d kinds: fewer than 200 of 15", len(applied)-failed,
					len(v.FaultsByKind))
			}
		}
	}
	opts := Options{Brokers: kafkaAddr, Env: commonEnv, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: consumers + 1,
		Partitions: 6, ConsumerEnv: consumerEnv, KillsNotForStalls: true, Judge: judge,
		ConsumerRedis: func(name string) string { return links[name].Listen }}
	var sentinelNodes map[string]*Node // by address
	if cfg.Sentinel {
		sentinelNodes = startSentinelSet(t)
		opts.Redis, opts.ConsumerRedis = sentinelPrimary, nil
		opts.SentinelAddrs, opts.SentinelMaster = sentinelAddrs, "kfpipe"
	}
	pp = Start(t, opts)
	p := pp
	spare := p.Consumers[consumers]
	if err := spare.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop the spare consumer: %v", err)
	}
	p.Sink.Reply(true)

	// The receiver's handling time: 1–20 ms, plus what the schedule adds.
	var slowAll atomic.Int64 // ms for everyone
	var slowMu sync.Mutex
	slowUser := map[string]time.Duration{}
	p.Sink.Delay(func(user string) time.Duration {
		d := time.Millisecond + rand.N(20*time.Millisecond)
		d += time.Duration(slowAll.Load()) * time.Millisecond
		slowMu.Lock()
		d += slowUser[user]
		slowMu.Unlock()
		return d
	})

	daemonOf := func(target string) *Daemon {
		switch target {
		case "producer":
			return p.Producer
		case "dlq":
			return p.DLQ
		}
		for _, c := range p.Consumers {
			if c.Name == target {
				return c
			}
		}
		return nil
	}
	userOf := func(target string) string {
		i, _ := strconv.Atoi(strings.TrimPrefix(target, "u"))
		return p.UserName(i)
	}
	kfOf := func(user string) string {
		var h uint32
		for _, c := range user {
			h = h*31 + uint32(c)
		}
		return p.OpenKfIDs[int(h)%len(p.OpenKfIDs)]
	}
	// The dense pool's account is the Feeder's (by index); other users'
	// by kfOf.
	denseKf := func(user string) string {
		i, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(user, "-", 2)[0], "u"))
		return p.OpenKfIDs[i%len(p.OpenKfIDs)]
	}
	const repairTimeout = 90 * time.Second
	// One step at a time on a daemon: partitions-added restarts them all,
	// and may run past the time the schedule gave it.
	var sentinelMu sync.Mutex
	var partitions atomic.Int64 // the main topic's, as the daemons are told
	partitions.Store(int64(p.Opts.Partitions))
	locks := map[*Daemon]*sync.Mutex{}
	for _, d := range p.Daemons() {
		locks[d] = &sync.Mutex{}
	}
	apply := func(ctx context.Context, st Step, f *Feeder) (a Applied) {
		a = Applied{Step: st, Start: time.Now()}
		defer func() { a.End = time.Now() }()
		if d := daemonOf(st.Target); d != nil {
			locks[d].Lock()
			defer locks[d].Unlock()
			// The wait for the lock is not the fault's.
			a.Start = time.Now()
		}
		fail := func(err error) Applied {
			if err != nil {
				a.Err = err.Error()
			}
			return a
		}
		wait := func() { Pause(ctx, st.Dur, st.Dur) }
		d := daemonOf(st.Target)
		switch st.Kind {
		case ConsumerKill9, ProducerKill9, DLQKill9:
			if _, err := d.Kill9(); err != nil {
				return fail(err)
			}
			wait()
			return fail(d.Restart(repairTimeout))
		case ConsumerRestart, ProducerRestart, DLQRestart, ScaleIn:
			if err := d.Stop(40 * time.Second); err != nil {
				// A hang or a non-zero exit is a finding (Stop killed a
				// hung process); the step goes on: start it again.
				a.Finding = "SIGTERM: " + err.Error()
			}
			wait()
			if err := d.Restart(repairTimeout); err != nil {
				return fail(err)
			}
			return a
		case ConsumerFreeze, ProducerFreeze:
			if _, err := d.Freeze(); err != nil {
				return fail(err)
			}
			wait()
			return fail(d.Thaw())
		case ScaleOut:
			if err := d.Restart(repairTimeout); err != nil {
				return fail(err)
			}
			wait()
			if err := d.Stop(40 * time.Second); err != nil {
				a.Finding = "SIGTERM: " + err.Error()
			}
			return a
		case RedisDelay:
			if err := Latency(links[st.Target], time.Duration(st.Arg)*time.Millisecond); err != nil {
				return fail(err)
			}
			wait()
			return fail(Heal(links[st.Target]))
		case RedisReset:
			if _, err := links[st.Target].AddToxic("reset", "reset_peer", "downstream", float32(st.Arg)/100,
				toxiclient.Attributes{"timeout": 0}); err != nil {
				return fail(err)
			}
			wait()
			return fail(Heal(links[st.Target]))
		case RedisPartition:
			p.RecordCut(d.Tag(), time.Now())
			if err := Blackhole(links[st.Target]); err != nil {
				return fail(err)
			}
			wait()
			return fail(Heal(links[st.Target]))
		case ReceiverSlow:
			slowAll.Store(int64(st.Arg))
			wait()
			slowAll.Store(0)
		case SlowHandler:
			a.User = userOf(st.Target)
			slowMu.Lock()
			slowUser[a.User] = time.Duration(st.Arg) * time.Millisecond
			slowMu.Unlock()
			wait()
			slowMu.Lock()
			delete(slowUser, a.User)
			slowMu.Unlock()
		case BrokerKill9, BrokerStop:
			i, _ := strconv.Atoi(strings.TrimPrefix(st.Target, "broker-"))
			n := cluster.Node(int32(i))
			stop := n.Kill9
			if st.Kind == BrokerStop {
				stop = n.Stop
			}
			if err := stop(); err != nil {
				return fail(err)
			}
			wait()
			// A node killed moments ago sometimes exits during its start
			// (its ports or files not yet released): try again.
			var err error
			for try := 0; try < 3; try++ {
				if err = n.Resume(); err == nil {
					break
				}
				Pause(ctx, 3*time.Second, 3*time.Second)
			}
			return fail(err)
		case ReceiverFlaky:
			p.Sink.FailRatio(float64(st.Arg) / 100)
			wait()
			p.Sink.FailRatio(0)
		case FailUser:
			a.User = userOf(st.Target)
			p.Sink.FailUser(a.User)
			wait()
			p.Sink.UnfailUser(a.User)
		case FailAll:
			p.Sink.Down(true)
			wait()
			p.Sink.Down(false)
		case DownstreamFixed:
			if _, err := batchRetry(ctx, p, map[string]any{"reason": "downstream_error"}); err != nil {
				return fail(err)
			}
		case ReplyThrottle:
			codes := []int{45009, 45011, 45033, -1}
			p.Fake.FailNextSend(st.Arg, codes[st.N%len(codes)])
		case SyncThrottle:
			p.Fake.FailNext(st.Arg, 45009)
		case ReplyServicer:
			a.User = userOf(st.Target)
			kf := denseKf(a.User)
			prev := p.Fake.SessionState(kf, a.User)
			p.Fake.SetSessionState(kf, a.User, 3, "nemesis-servicer")
			wait()
			p.Fake.SetSessionState(kf, a.User, prev, "")
		case Flood:
			bot := fmt.Sprintf("%s-%d", p.BotName(), st.N)
			runMu.Lock()
			flooders[bot] = true
			runMu.Unlock()
			bctx, cancel := context.WithTimeout(ctx, st.Dur)
			f.Bot(bctx, bot, float64(st.Arg))
			cancel()
		case HumanBurst:
			a.User = userOf(fmt.Sprintf("u%04d", st.N*7%users))
			burst := make([]string, st.Arg)
			for i := range burst {
				burst[i] = a.User
			}
			f.appendUsers(ctx, burst, func(int, string) string { return denseKf(a.User) })
		case SentinelFailover:
			// One at a time: the next needs the last one's old primary
			// back as the replica.
			sentinelMu.Lock()
			defer sentinelMu.Unlock()
			note, err := sentinelFailover(ctx, p, sentinelNodes, st.Dur)
			a.Note = note
			return fail(err)
		case PartitionsAdded:
			note, finding, err := addPartitionsRunbook(ctx, p, locks, &partitions, st.Arg)
			a.Note, a.Finding = note, finding
			return fail(err)
		case LayoutChange:
			note, err := layoutJump(ctx, p, f, int(partitions.Load()), st, kfOf)
			a.Note = note
			return fail(err)
		default:
			return fail(fmt.Errorf("kind %s not driven", st.Kind))
		}
		return a
	}

	// Feed appends whole messages every 100 ms: a rate in tens.
	rate := Size(20.0, 30.0)
	load := Load{Total: int(rate * duration.Seconds()), Users: users, Rate: rate}
	Run(t, name, p, load, Size(4*time.Minute, 15*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		f := p.feeder
		start := time.Now()
		var wg sync.WaitGroup
		tctx, stopTraffic := context.WithCancel(ctx)
		// Conversation-paced customers: each writes every 2–6 s.
		wg.Add(1)
		go func() {
			defer wg.Done()
			conv := Size(20, 60)
			next := make([]time.Time, conv)
			for i := range next {
				next[i] = time.Now().Add(rand.N(6 * time.Second))
			}
			for Pause(tctx, 200*time.Millisecond, 200*time.Millisecond) {
				var batch []string
				for i := range next {
					if time.Now().After(next[i]) {
						batch = append(batch, fmt.Sprintf("c%03d-%s", i, p.Prefix[len("chaos-"):len(p.Prefix)-1]))
						next[i] = time.Now().Add(2*time.Second + rand.N(4*time.Second))
					}
				}
				if len(batch) > 0 {
					f.appendUsers(tctx, batch, func(_ int, u string) string { return kfOf(u) })
				}
			}
		}()
		// Write-once customers: a new one every half second.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; Pause(tctx, 500*time.Millisecond, 500*time.Millisecond); n++ {
				u := fmt.Sprintf("w%05d-%s", n, p.Prefix[len("chaos-"):len(p.Prefix)-1])
				f.appendUsers(tctx, []string{u}, func(_ int, u string) string { return kfOf(u) })
			}
		}()
		var steps sync.WaitGroup
		for _, st := range sched.Steps {
			if !Pause(ctx, time.Until(start.Add(st.At)), time.Until(start.Add(st.At))) {
				break
			}
			t.Logf("nemesis %s", st)
			steps.Add(1)
			go func() {
				defer steps.Done()
				a := apply(ctx, st, f)
				runMu.Lock()
				applied = append(applied, a)
				runMu.Unlock()
				if a.Err != "" || a.Finding != "" || a.Note != "" {
					t.Logf("nemesis %s: %s%s%s", st, a.Err, a.Finding, a.Note)
				}
			}()
		}
		Pause(ctx, time.Until(start.Add(duration)), time.Until(start.Add(duration)))
		stopTraffic()
		wg.Wait()
		steps.Wait()
		// Whatever a step left down is given back: every consumer but the
		// spare runs, nothing is slowed or failing.
		for _, c := range p.Consumers[:consumers] {
			if !c.Running() {
				if err := c.Restart(repairTimeout); err != nil {
					return err
				}
			}
		}
		if cluster != nil {
			for i, n := range cluster.Nodes {
				if err := n.Resume(); err != nil {
					rec.Problem("broker %d not running after the schedule: %v", i+1, err)
				}
			}
		}
		rec.Extra("schedule_steps", len(sched.Steps))
		return nil
	})
}

// startSentinelSet starts scripts/redis.sh's Sentinel setup (its fixed
// ports: one run at a time on a machine, like TestChaosSentinelFailover)
// and returns its two data nodes by address.
func startSentinelSet(t *testing.T) map[string]*Node {
	testenv.Tool(t, "redis-sentinel")
	for _, a := range append([]string{sentinelPrimary, sentinelReplica}, sentinelAddrs...) {
		if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			_ = c.Close()
			t.Fatalf("%s is in use: the sentinel setup needs its fixed ports", a)
		}
	}
	dir := t.TempDir()
	node := func(name, addr string) *Node {
		return &Node{t: t, script: "redis.sh", name: name, runDir: dir, Addr: addr, env: []string{"KFPIPE_RUN_DIR=" + dir}}
	}
	primary := node("sentinel-primary", sentinelPrimary)
	t.Cleanup(func() {
		if err := primary.run("sentinel-stop"); err != nil {
			t.Logf("sentinel-stop: %v", err)
		}
	})
	if err := primary.run("sentinel-start"); err != nil {
		t.Fatal(err)
	}
	return map[string]*Node{sentinelPrimary: primary, sentinelReplica: node("sentinel-replica", sentinelReplica)}
}

// sentinelFailover kills the primary the sentinels name now with SIGKILL,
// waits for them to promote the replica (recorded as a failover: the
// evidence counts a repeat of an effect acknowledged just before it apart),
// and after dur starts the old primary again, which rejoins as the
// replica; it waits until the sentinels see it as one.
func sentinelFailover(ctx context.Context, p *Pipeline, nodes map[string]*Node, dur time.Duration) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinelAddrs[0]})
	defer sc.Close()
	master := func() string {
		addr, err := sc.GetMasterAddrByName(ctx, "kfpipe").Result()
		if err != nil {
			return ""
		}
		return strings.Join(addr, ":")
	}
	old := master()
	victim := nodes[old]
	if victim == nil {
		return "", fmt.Errorf("the sentinels name %q as the primary", old)
	}
	down := time.Now()
	if err := victim.Kill9(); err != nil {
		return "", err
	}
	p.RecordFailover(down, time.Now())
	promoted := ""
	for time.Since(down) < 30*time.Second && Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
		if m := master(); m != "" && m != old {
			promoted = m
			break
		}
	}
	after := time.Since(down).Round(100 * time.Millisecond)
	Pause(ctx, dur, dur)
	err := victim.Resume()
	if promoted == "" {
		return "", errors.Join(fmt.Errorf("no replica promoted within 30s of killing %s", old), err)
	}
	if err != nil {
		return "", err
	}
	// Rejoined: the old primary (started again empty: no persistence)
	// replicates the new one and has finished its full sync. The sentinels
	// list it as a replica before that; a failover then would promote an
	// empty replica and lose every key — Redis's hazard, not one an
	// operator runs into by design, and one that no dedup survives.
	rc := redis.NewClient(&redis.Options{Addr: old})
	defer rc.Close()
	start := time.Now()
	for time.Since(start) < 60*time.Second {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_sync_in_progress:0") &&
			strings.Contains(info, "master_port:"+strings.Split(promoted, ":")[1]) {
			return fmt.Sprintf("primary %s -> %s after %s; %s back as the replica, synced %s after its start", old, promoted, after,
				old, time.Since(start).Round(100*time.Millisecond)), nil
		}
		if !Pause(ctx, 200*time.Millisecond, 200*time.Millisecond) {
			break
		}
	}
	return "", fmt.Errorf("%s not synced as a replica of %s within 60s", old, promoted)
}

// addPartitionsRunbook is docs/operations.md's runbook for adding
// partitions, done mid-run: stop kf-producer (WeChat keeps the messages),
// wait for the schedule-consumers' lag to reach zero, add n partitions to
// the main topic, set the new count in every daemon's environment and
// restart kf-producer, the running schedule-consumers one at a time and
// the dlq-consumer. A daemon that does not stop cleanly is a finding; a
// lag that never reaches zero leaves the topic as it was (an error: the
// step was not carried out).
func addPartitionsRunbook(ctx context.Context, p *Pipeline, locks map[*Daemon]*sync.Mutex, partitions *atomic.Int64, n int) (note, finding string, err error) {
	var findings []string
	stop := func(d *Daemon) {
		if err := d.Stop(40 * time.Second); err != nil {
			findings = append(findings, d.Name+" SIGTERM: "+err.Error())
		}
	}
	defer func() { finding = strings.Join(findings, "; ") }()
	locks[p.Producer].Lock()
	defer locks[p.Producer].Unlock()
	stop(p.Producer)
	restartProducer := func() error { return p.Producer.Restart(90 * time.Second) }
	lagCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	waited := time.Now()
	err = waitZeroLag(lagCtx, p)
	cancel()
	if err != nil {
		return "", "", errors.Join(fmt.Errorf("consumer lag not zero: %w", err), restartProducer())
	}
	before := int(partitions.Load())
	after := before + n
	ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": p.Opts.Brokers})
	if err != nil {
		return "", "", errors.Join(err, restartProducer())
	}
	res, err := ac.CreatePartitions(ctx, []kafka.PartitionsSpecification{{Topic: p.MainTopic, IncreaseTo: after}})
	ac.Close()
	if err == nil && (len(res) != 1 || res[0].Error.Code() != kafka.ErrNoError) {
		err = fmt.Errorf("add partitions: %v", res)
	}
	if err != nil {
		return "", "", errors.Join(err, restartProducer())
	}
	// Every daemon's config says the new count before any starts again
	// (their start-up check refuses a mismatch), the stopped spare's too.
	for _, d := range p.Daemons() {
		if d != p.Producer {
			locks[d].Lock()
		}
		d.env = append(d.env, fmt.Sprintf("KFPIPE_KAFKA_TOPICS_MAIN_PARTITIONS=%d", after))
		if d != p.Producer {
			locks[d].Unlock()
		}
	}
	partitions.Store(int64(after))
	if err := restartProducer(); err != nil {
		return "", "", err
	}
	for _, d := range append(append([]*Daemon{}, p.Consumers...), p.DLQ) {
		locks[d].Lock()
		if d.Running() {
			stop(d)
			if err := d.Restart(90 * time.Second); err != nil {
				locks[d].Unlock()
				return "", "", fmt.Errorf("restart %s: %w", d.Name, err)
			}
		}
		locks[d].Unlock()
	}
	return fmt.Sprintf("partitions %d->%d, lag zero after %s", before, after, time.Since(waited).Round(100*time.Millisecond)), "", nil
}

// waitZeroLag waits until the schedule-consumers' group has committed
// every partition of the main topic up to its end.
func waitZeroLag(ctx context.Context, p *Pipeline) error {
	group := ""
	for _, kv := range p.Consumers[0].env {
		if v, ok := strings.CutPrefix(kv, "KFPIPE_KAFKA_CONSUMER_GROUP_ID="); ok {
			group = v
		}
	}
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": p.Opts.Brokers, "group.id": group,
		"enable.auto.commit": false})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	topic := p.MainTopic
	lag := int64(-1)
	for {
		if lag, err = groupLag(c, p.Opts.Brokers, topic); err == nil && lag == 0 {
			return nil
		}
		if !Pause(ctx, time.Second, time.Second) {
			return fmt.Errorf("lag %d (%v)", lag, err)
		}
	}
}

// groupLag is the consumer's group's lag on topic: the records past its
// committed offsets. A partition whose last records are a transaction's
// commit marker (the dlq-consumer re-injects in transactions) stays one
// or two short of its end with nothing left to read: such a tail counts
// as no lag when a read from the committed offset returns no record.
func groupLag(c *kafka.Consumer, brokers, topic string) (int64, error) {
	md, err := c.GetMetadata(&topic, false, 5000)
	if err != nil {
		return 0, err
	}
	var parts []kafka.TopicPartition
	for _, pm := range md.Topics[topic].Partitions {
		parts = append(parts, kafka.TopicPartition{Topic: &topic, Partition: pm.ID})
	}
	committed, err := c.Committed(parts, 5000)
	if err != nil {
		return 0, err
	}
	var lag int64
	for _, tp := range committed {
		lo, hi, err := c.QueryWatermarkOffsets(topic, tp.Partition, 5000)
		if err != nil {
			return 0, err
		}
		at := int64(tp.Offset)
		if at < 0 {
			at = lo
		}
		if n := hi - at; n > 0 {
			if n <= 2 {
				if left, err := recordsFrom(brokers, topic, tp.Partition, at, hi); err != nil || left == 0 {
					continue
				}
			}
			lag += n
		}
	}
	return lag, nil
}

// recordsFrom counts the records a read_committed consumer gets from
// partition's offsets [from, to) (control records are not returned).
func recordsFrom(brokers, topic string, partition int32, from, to int64) (int, error) {
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "nemesis-lag-probe",
		"enable.auto.commit": false, "isolation.level": "read_committed"})
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Close() }()
	if err := c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: partition, Offset: kafka.Offset(from)}}); err != nil {
		return 0, err
	}
	n := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		ev := c.Poll(200)
		if m, ok := ev.(*kafka.Message); ok && m.TopicPartition.Error == nil && int64(m.TopicPartition.Offset) < to {
			n++
		}
	}
	return n, nil
}

// layoutJump sends st.Arg messages a second of 100 new customers, all
// placed in one partition (st.N modulo the count), for st.Dur: send-time
// slots with more marks than a bucket of the partition's layout holds, so
// its owner starts a new generation. The step waits for the partition's
// record to show it; an unchanged layout is an error (the step did not do
// what it names).
func layoutJump(ctx context.Context, p *Pipeline, f *Feeder, parts int, st Step, kfOf func(string) string) (string, error) {
	part := int32(st.N % parts)
	key := fmt.Sprintf("%sst:{%s:%d}:own", p.Prefix, p.MainTopic, part)
	read := func() string {
		v, _ := p.rdb.HMGet(ctx, key, "ly", "lyv", "bk", "bk0", "bkfrom").Result()
		return fmt.Sprint(v)
	}
	before := read()
	var users []string
	for i := 0; len(users) < 100; i++ {
		u := fmt.Sprintf("l%03d-%04d-%s", st.N, i, p.Prefix[len("chaos-"):len(p.Prefix)-1])
		if kafkaclient.KeyPartition(u, parts) == part {
			users = append(users, u)
		}
	}
	// A fifth of a second's messages every 200 ms, in one append (the
	// step's customers all write to one account).
	next := 0
	kf := kfOf(users[0])
	for end := time.Now().Add(st.Dur); time.Now().Before(end) && Pause(ctx, 200*time.Millisecond, 200*time.Millisecond); {
		burst := make([]string, max(1, st.Arg/5))
		for i := range burst {
			burst[i] = users[next%len(users)]
			next++
		}
		f.appendUsers(ctx, burst, func(int, string) string { return kf })
		if now := read(); now != before {
			return fmt.Sprintf("partition %d layout %s -> %s after %d messages", part, before, now, next), nil
		}
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		if now := read(); now != before {
			return fmt.Sprintf("partition %d layout %s -> %s", part, before, now), nil
		}
		if !Pause(ctx, time.Second, time.Second) {
			break
		}
	}
	return "", fmt.Errorf("partition %d: layout unchanged after %d messages at %d/s: %s", part, next, st.Arg, before)
}

// countFailed counts the steps that could not be carried out.
func countFailed(as []Applied) int {
	n := 0
	for _, a := range as {
		if a.Err != "" {
			n++
		}
	}
	return n
}
