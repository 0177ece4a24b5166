package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeBinaries()
	os.Exit(code)
}

// TestChaosConsumerKill9: two schedule-consumers in one group; one of them,
// picked at random, is killed with SIGKILL at random moments and
// restarted, with cooperative rebalances in between. Every message's
// effect must happen, once (a second effect only inside a killed
// process's at-least-once window), each user's effects in order, and no
// user may wait more than twice the session timeout for its next effect
// after a kill (max_user_stall), with the shipped timings.
func TestChaosConsumerKill9(t *testing.T) {
	svc := NeedServices(t)
	// 20 s of feeding in make test: a kill late in a shorter feed found
	// every partition drained and nobody waiting on the victim.
	load := Size(Load{Total: 5000, Users: 200, Rate: 250}, Load{Total: 50000, Users: 1000, Rate: 1000})
	kills := Size(2, 3)
	// The shipped timings (dedup lease, session timeout, commit interval,
	// actor idle timeout): a crashed consumer's users must be processing
	// again within twice the session timeout with them, not only with
	// shortened ones.
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: 2 * time.Millisecond, StallLimit: 2 * config.DefaultSessionTimeout,
		ConsumerEnv: map[string]string{"KFPIPE_KAFKA_CONSUMER_COMMIT_INTERVAL": "1s", "KFPIPE_PROCESSOR_IDLE_TIMEOUT": "2m"}})
	feedFor := time.Duration(float64(load.Total)/load.Rate) * time.Second
	Run(t, "consumer-kill9", p, load, Size(90*time.Second, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		// Spread the kills over the feeding time, so each lands under load.
		gap := feedFor / time.Duration(kills+1)
		pages := pageSignal(p)
		defer p.OnSyncMsg(nil)
		for i := 0; i < kills; i++ {
			if !Pause(ctx, gap/2, gap) {
				return ctx.Err()
			}
			// The victim is working on partitions, and the kill lands as a
			// page of messages goes out to the consumers: some of them are
			// for the victim's users, who then wait on it (the report counts
			// them per kill, and a kill with none fails the run).
			victim := busyConsumer(ctx, p, 10*time.Second)
			if err := awaitPage(ctx, pages); err != nil {
				return err
			}
			if _, err := victim.Kill9(); err != nil {
				return err
			}
			if !Pause(ctx, 300*time.Millisecond, 1500*time.Millisecond) {
				return ctx.Err()
			}
			if err := victim.Restart(60 * time.Second); err != nil {
				return err
			}
		}
		return nil
	})
}

// pageSignal returns a channel that gets a value (at most one waits) each
// time the fake WeChat answers a sync_msg page with messages; p.OnSyncMsg(nil)
// ends it.
func pageSignal(p *Pipeline) <-chan struct{} {
	pages := make(chan struct{}, 1)
	p.OnSyncMsg(func(n int) {
		if n > 0 {
			select {
			case pages <- struct{}{}:
			default:
			}
		}
	})
	return pages
}

// awaitPage waits (up to 3 s) for the next page of messages after now, so
// that a fault aimed at a consumer lands while some of its users' messages
// are on their way to it.
func awaitPage(ctx context.Context, pages <-chan struct{}) error {
	select {
	case <-pages: // a page answered before we aimed
	default:
	}
	select {
	case <-pages:
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// busyConsumer picks a schedule-consumer with users waiting on it: users
// with a message sent and not yet handled whose last effect it made (the
// evidence's "users waiting on the victim", so the kill tests a stall),
// the one with most of them. A consumer just restarted may own nothing
// yet, and one whose partitions are drained leaves nobody waiting. A
// fast handler clears a user in milliseconds, so one or two users seen
// waiting may be served before the kill lands: for the first half of wait
// it takes only a consumer with at least busyUsers waiting. After wait
// without one it picks any consumer; the report then shows the kill found
// no user.
func busyConsumer(ctx context.Context, p *Pipeline, wait time.Duration) *Daemon {
	start := time.Now()
	for {
		need := busyUsers
		if time.Since(start) > wait/2 {
			need = 1
		}
		waiting := usersWaitingOn(p)
		var best *Daemon
		for _, c := range p.Consumers {
			if c.Running() && waiting[c.Tag()] >= need && (best == nil || waiting[c.Tag()] > waiting[best.Tag()]) {
				best = c
			}
		}
		if best != nil {
			return best
		}
		if time.Since(start) > wait || ctx.Err() != nil {
			return p.Consumers[rand.IntN(len(p.Consumers))]
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// busyUsers is how many users waiting on a consumer make it a victim
// whose kill certainly finds one of them still waiting.
const busyUsers = 4

// usersWaitingOn counts, by consumer incarnation tag, the users with a
// message sent and not yet handled whose last effect that incarnation made.
// What was sent is read before what was handled: a message handled between
// the two reads counts as handled, never as waiting.
func usersWaitingOn(p *Pipeline) map[string]int {
	if p.feeder == nil {
		return nil
	}
	sent := p.feeder.Sent()
	last := map[string]string{} // user → tag of its last effect
	handled := map[string]bool{}
	for _, d := range p.Sink.Deliveries() {
		last[d.User] = d.Tag
		handled[d.MsgID] = true
	}
	waiting := map[string]bool{}
	for _, s := range sent {
		if !handled[s.MsgID] {
			waiting[s.User] = true
		}
	}
	out := map[string]int{}
	for u := range waiting {
		if tag, ok := last[u]; ok {
			out[tag]++
		}
	}
	return out
}

// TestChaosProducerKill9: kf-producer is killed with SIGKILL at random
// moments while syncs are in progress (a slow fake WeChat, small pages,
// four accounts), and restarted. Re-pulled pages put copies on the topic;
// the consumer's dedup must keep effects at one per message. After each
// kill, the time until every account is synced again (max_ingest_gap) is
// bounded by the sync lock TTL plus one sync.
func TestChaosProducerKill9(t *testing.T) {
	producerKill9(t, "producer-kill9", nil)
}

// TestChaosProducerKill9ShippedTimings is producer-kill9 with the shipped
// sync timings instead of the suite's short ones (sync lock TTL 10 s
// instead of 2 s, safety sync every minute instead of every second, retry
// backoff up to 30 s instead of 2 s): a killed producer's lock holds its
// accounts longer, and the restarted producer syncs them when that lock
// runs out, not at its next safety sync: max_ingest_gap must stay within
// the lock TTL plus one sync. Full size only (make chaos).
func TestChaosProducerKill9ShippedTimings(t *testing.T) {
	SkipUnlessFull(t)
	producerKill9(t, "producer-kill9-shipped-timings", map[string]string{
		"KFPIPE_SYNC_SAFETY_INTERVAL": "1m", "KFPIPE_SYNC_LOCK_TTL": "10s", "KFPIPE_SYNC_RETRY_MAX": "30s"})
}

// TestChaosProducerKill9EtcdLock is producer-kill9 with sync.lock.backend
// and idgen.allocator.backend etcd: the accounts' sync locks are coord
// locks (a killed producer's lock goes with its lease), the cursors live in
// etcd, written only in a transaction on the lock's fencing token, and the
// worker IDs are coord instance IDs, freed when a killed producer's lease
// expires.
func TestChaosProducerKill9EtcdLock(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	raw, ns := testenv.Etcd(t)
	producerKill9(t, "producer-kill9-etcd-lock", map[string]string{
		"KFPIPE_COORD_ENABLED": "true", "KFPIPE_COORD_ENDPOINTS": strings.Join(testenv.EtcdEndpoints(t), ","),
		"KFPIPE_COORD_NAMESPACE": ns, "KFPIPE_COORD_KEEP_ALIVE": "2s",
		"KFPIPE_SYNC_LOCK_BACKEND": "etcd", "KFPIPE_IDGEN_ALLOCATOR_BACKEND": "etcd"})
	// The run proves something about etcd only if the cursors were there.
	resp, err := raw.Get(t.Context(), ns+"config/sync/cursors/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 4 {
		t.Fatalf("%d account cursors in etcd, want the 4 accounts'", resp.Count)
	}
	// The worker IDs were etcd instance IDs too: the killed incarnations'
	// are freed when their leases expire (the last one released its own
	// at its graceful stop), so none is left held.
	began := time.Now()
	deadline := began.Add(15 * time.Second)
	for {
		ids, err := raw.Get(t.Context(), ns+"instance_ids/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if ids.Count == 0 {
			t.Logf("no worker ID held %s after the run", time.Since(began).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d worker IDs still held in etcd 15 s after the run: a killed producer's ID was not freed with its lease", ids.Count)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// oneSync is the allowance for a restarted kf-producer to start and run
// one sync pass (sync_msg, produce, delivery reports) once it can take an
// account's lock.
const oneSync = 5 * time.Second

// ingestionGap waits until the fake WeChat has seen a sync_msg call for
// every account after the first from calls (the restarted producer's: the
// killed one makes none) and returns the time from the kill at killed to
// the last account's first call — how long ingestion of some account
// stood still. A producer syncs every account at start; an account whose
// lock the killed process held is synced when that lock can be taken. ok
// is false when some account got no call within limit.
func ingestionGap(ctx context.Context, p *Pipeline, killed time.Time, from int, limit time.Duration) (time.Duration, bool) {
	for {
		seen := map[string]bool{}
		for _, c := range p.Fake.SyncCalls()[from:] {
			seen[c.OpenKfID] = true
		}
		gap := time.Since(killed)
		if len(seen) >= len(p.OpenKfIDs) {
			return gap, true
		}
		if gap > limit || ctx.Err() != nil {
			return gap, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func producerKill9(t *testing.T, name string, producerEnv map[string]string) {
	svc := NeedServices(t)
	// The longest an account's ingestion may stand still after a kill: the
	// killed process's sync lock (the suite's 2 s, or the env's) runs out,
	// and the restarted producer syncs then (not at its next safety tick).
	lockTTL := 2 * time.Second
	if v, ok := producerEnv["KFPIPE_SYNC_LOCK_TTL"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KFPIPE_SYNC_LOCK_TTL %q: %v", v, err)
		}
		lockTTL = d
	}
	gapBound := lockTTL + oneSync
	load := Size(Load{Total: 3000, Users: 100, Rate: 300}, Load{Total: 20000, Users: 500, Rate: 500})
	kills := Size(3, 8)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, OpenKfIDs: 4, PageLimit: 50,
		SinkSleep: time.Millisecond, ProducerEnv: producerEnv})
	p.Fake.SetLatency(20 * time.Millisecond)
	feedFor := time.Duration(float64(load.Total)/load.Rate) * time.Second
	rep := Run(t, name, p, load, Size(90*time.Second, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		gap := feedFor / time.Duration(kills+1)
		pages := pageSignal(p)
		defer p.OnSyncMsg(nil)
		targeted := 0
		var maxGap time.Duration
		for i := 0; i < kills; i++ {
			if !Pause(ctx, gap/2, gap) {
				return ctx.Err()
			}
			// Aim at the window between produce and the cursor step: a few
			// milliseconds after WeChat handed out a page of messages, the
			// page is being produced or awaiting its delivery reports.
			select {
			case <-pages: // drop a page answered before we aimed
			default:
			}
			select {
			case <-pages:
				targeted++
				Pause(ctx, 2*time.Millisecond, 25*time.Millisecond)
			case <-time.After(3 * time.Second):
			}
			k, err := p.Producer.Kill9()
			if err != nil {
				return err
			}
			from := len(p.Fake.SyncCalls()) // every later call is the next incarnation's
			if !Pause(ctx, 200*time.Millisecond, time.Second) {
				return ctx.Err()
			}
			if err := p.Producer.Restart(60 * time.Second); err != nil {
				return err
			}
			gap, ok := ingestionGap(ctx, p, k.At, from, gapBound+30*time.Second)
			if !ok {
				rec.Problem("kill %d: an account not synced again within %s of the kill", i+1, gap.Round(100*time.Millisecond))
			}
			maxGap = max(maxGap, gap)
		}
		rec.Extra("kills_after_page", targeted)
		rec.Extra("max_ingest_gap", maxGap.Round(100*time.Millisecond))
		if maxGap > gapBound {
			rec.Problem("max_ingest_gap %s after a producer kill exceeds the lock TTL plus one sync (%s)",
				maxGap.Round(100*time.Millisecond), gapBound)
		}
		return nil
	})
	// Copies on the topic show that kills landed between produce and the
	// cursor step; without any the scenario proved less than it claims.
	if rep.KafkaRecords == rep.InKafka {
		t.Logf("%s: no kill landed between produce and cursor step this run (no re-pulled copies)", name)
	}
}

// TestChaosRedisOutage: the scenario's own Redis (AOF, fsync always) is
// killed under consumer load and resumed after a while. Meanwhile the
// consumer must report not ready naming redis, and commit nothing it has
// not finished; afterwards nothing is lost or repeated.
func TestChaosRedisOutage(t *testing.T) {
	svc := NeedServices(t)
	rd := PrivateRedis(t, true)
	load := Size(Load{Total: 4000, Users: 200, Rate: 250}, Load{Total: 15000, Users: 500, Rate: 250})
	outage := Size(10*time.Second, 30*time.Second)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: rd.Addr, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: 2 * time.Millisecond})
	Run(t, "redis-outage", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 4*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		if err := rd.Kill9(); err != nil {
			return err
		}
		down := time.Now()
		rec.Extra("outage", outage)
		// Readiness must turn 503 and name redis.
		if body, ok := waitReadyz(ctx, p.Consumers[0], http.StatusServiceUnavailable, 15*time.Second); !ok {
			rec.Problem("schedule-consumer /readyz not 503 during the Redis outage (last: %s)", body)
		} else if !strings.Contains(body, "redis") {
			rec.Problem("schedule-consumer /readyz 503 without naming redis: %q", body)
		} else {
			rec.Extra("consumer_unready_after", time.Since(down).Round(100*time.Millisecond))
		}
		if !Pause(ctx, time.Until(down.Add(outage)), time.Until(down.Add(outage))) {
			return ctx.Err()
		}
		if err := rd.Resume(); err != nil {
			return err
		}
		up := time.Now()
		for _, d := range p.Daemons() {
			if body, ok := waitReadyz(ctx, d, http.StatusOK, 60*time.Second); !ok {
				rec.Problem("%s not ready within 60s after Redis came back: %s", d.Tag(), body)
				// The failure is recorded; restart it as an orchestrator
				// would, so the rest of the run still judges the others.
				rec.Extra(d.Name+"_restarted", 1)
				if err := d.Stop(15 * time.Second); err != nil {
					rec.Problem("restart after Redis outage: %v", err)
				}
				if err := d.Restart(60 * time.Second); err != nil {
					return err
				}
			}
		}
		rec.Extra("ready_after_resume", time.Since(up).Round(100*time.Millisecond))
		return nil
	})
}

// TestChaosKafkaOutage (full suite only): the scenario's own broker is
// killed for 60 s while callbacks keep arriving. kf-producer must hold its
// cursors and report not ready; after the broker is back every message
// arrives, in order.
func TestChaosKafkaOutage(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	kb := PrivateKafka(t)
	const outage = 60 * time.Second
	load := Load{Total: 6000, Users: 300, Rate: 60}
	p := Start(t, Options{Brokers: kb.Addr, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1, SinkSleep: time.Millisecond,
		ProducerEnv: map[string]string{
			// A page waits at most 8 s for its delivery reports, so the
			// outage shows in readiness early; the cursor stays either way.
			"KFPIPE_KAFKA_PRODUCER_DELIVERY_TIMEOUT": "5s",
			"KFPIPE_SYNC_DELIVERY_WAIT":              "8s",
		}})
	Run(t, "kafka-outage", p, load, 5*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 15*time.Second, 15*time.Second) {
			return ctx.Err()
		}
		if err := kb.Kill9(); err != nil {
			return err
		}
		down := time.Now()
		rec.Extra("outage", outage)
		if body, ok := waitReadyz(ctx, p.Producer, http.StatusServiceUnavailable, 30*time.Second); !ok {
			rec.Problem("kf-producer /readyz not 503 during the Kafka outage (last: %s)", body)
		} else {
			rec.Extra("producer_unready_after", time.Since(down).Round(100*time.Millisecond))
		}
		// Whatever was in flight when the broker died has failed by now;
		// from here on no cursor may move while messages keep arriving.
		if !Pause(ctx, 15*time.Second, 15*time.Second) {
			return ctx.Err()
		}
		before, lenBefore := cursors(ctx, p), logLen(p)
		if !Pause(ctx, time.Until(down.Add(outage-time.Second)), time.Until(down.Add(outage-time.Second))) {
			return ctx.Err()
		}
		after, lenAfter := cursors(ctx, p), logLen(p)
		if lenAfter <= lenBefore {
			rec.Problem("no messages arrived upstream during the outage (%d → %d): the cursor check proves nothing", lenBefore, lenAfter)
		}
		for kf, c := range before {
			if after[kf] != c {
				rec.Problem("cursor of %s moved during the Kafka outage", kf)
			}
		}
		rec.Extra("upstream_during_outage", lenAfter-lenBefore)
		if code, body, err := p.Producer.Readyz(ctx); err != nil || code != http.StatusServiceUnavailable {
			rec.Problem("kf-producer /readyz at the end of the outage: %d %q %v", code, body, err)
		}
		if err := kb.Resume(); err != nil {
			return err
		}
		up := time.Now()
		if _, ok := waitReadyz(ctx, p.Producer, http.StatusOK, 90*time.Second); !ok {
			rec.Problem("kf-producer not ready within 90s after Kafka came back")
		}
		rec.Extra("producer_ready_after_resume", time.Since(up).Round(100*time.Millisecond))
		return nil
	})
}

// waitReadyz polls d's /readyz until it answers want or timeout passes; it
// returns the last body.
func waitReadyz(ctx context.Context, d *Daemon, want int, timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		code, body, err := d.Readyz(ctx)
		if err == nil && code == want {
			return body, true
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return last, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func cursors(ctx context.Context, p *Pipeline) map[string]string {
	out := map[string]string{}
	for _, kf := range p.OpenKfIDs {
		c, err := p.Cursor(ctx, kf)
		if err != nil {
			c = "error: " + err.Error()
		}
		out[kf] = c
	}
	return out
}

func logLen(p *Pipeline) int {
	n := 0
	for _, kf := range p.OpenKfIDs {
		n += p.Fake.Len(kf)
	}
	return n
}

// TestChaosReplyKill9: the consumers' handler (the Sink, over the http
// handler's protocol) answers every message with a reply, which the
// consumers send to the fake WeChat exactly once; consumers are killed
// with SIGKILL several times while they reply. Every message must get its
// reply once (a repeat of a delivered msgid only inside the crash window
// of a kill), each user's replies in the order of its messages, and
// lost=0 dup=0 reordered=0 as everywhere. Each user sends at most five
// messages: WeChat (and the fake) refuses a sixth reply after a
// customer's last message, so a longer backlog of one user's replies
// would be cut by WeChat's rule, not by kfpipe.
func TestChaosReplyKill9(t *testing.T) {
	svc := NeedServices(t)
	// 20 s of feeding and two kills in make test, so each kill lands while
	// the victim's users have messages waiting (a kill takes ~10 s with its
	// restart: a third one in a fresh-clone run came after the feed and
	// found nobody waiting).
	load := Size(Load{Total: 2000, Users: 500, Rate: 100, MaxPerUser: 5},
		Load{Total: 12000, Users: 3000, Rate: 400, MaxPerUser: 5})
	kills := Size(2, 5)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2, Replies: true,
		SinkSleep: 2 * time.Millisecond})
	feedFor := time.Duration(float64(load.Total)/load.Rate) * time.Second
	Run(t, "reply-kill9", p, load, Size(90*time.Second, 4*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		gap := feedFor / time.Duration(kills+1)
		for range kills {
			if !Pause(ctx, gap/2, gap) {
				return ctx.Err()
			}
			victim := busyConsumer(ctx, p, 10*time.Second)
			if _, err := victim.Kill9(); err != nil {
				return err
			}
			if !Pause(ctx, 300*time.Millisecond, 1500*time.Millisecond) {
				return ctx.Err()
			}
			if err := victim.Restart(60 * time.Second); err != nil {
				return err
			}
		}
		return nil
	})
}
