package chaos

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// The fixed ports of scripts/redis.sh sentinel-start.
var sentinelAddrs = []string{"127.0.0.1:26479", "127.0.0.1:26480", "127.0.0.1:26481"}

const (
	sentinelPrimary = "127.0.0.1:26379"
	sentinelReplica = "127.0.0.1:26380"
)

// TestChaosSentinelFailover (full suite only): the daemons run on Redis
// Sentinel (primary, one replica, three sentinels). Under load the primary
// is killed with SIGKILL; the sentinels promote the replica and locks,
// dedup marks and the DLQ index carry on there. Afterwards a consumer is
// killed (redeliveries the dedup marks on the new primary must absorb) and
// one user's downstream starts failing (dead letters indexed on the new
// primary).
//
// Replication is asynchronous: a done mark the old primary acknowledged
// but had not passed on is gone, and its message can take effect again.
// Such repeats are counted as dup_after_failover, only when the first
// effect lay within Options.FailoverWindow (1 s) before the kill; every
// other repeat is a dup and fails the run.
func TestChaosSentinelFailover(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	testenv.Tool(t, "redis-sentinel")
	for _, a := range append([]string{sentinelPrimary, "127.0.0.1:26380"}, sentinelAddrs...) {
		if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			_ = c.Close()
			t.Fatalf("%s is in use: the sentinel setup needs its fixed ports", a)
		}
	}
	set := &Node{t: t, script: "redis.sh", name: "sentinel-primary", runDir: t.TempDir(), Addr: sentinelPrimary}
	set.env = []string{"KFPIPE_RUN_DIR=" + set.runDir}
	t.Cleanup(func() {
		if err := set.run("sentinel-stop"); err != nil {
			t.Logf("sentinel-stop: %v", err)
		}
	})
	if err := set.run("sentinel-start"); err != nil {
		t.Fatal(err)
	}
	// 80 s of feeding: the consumer kill after the failover (15–18 s,
	// the promotion, every daemon ready, 5–8 s) must land while messages
	// still flow, or nobody waits on the victim and the stall is untested.
	load := Load{Total: 16000, Users: 500, Rate: 200}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: sentinelPrimary, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: time.Millisecond, SentinelAddrs: sentinelAddrs, SentinelMaster: "kfpipe"})
	failing := fmt.Sprintf("u0007-%s", p.Prefix[len("chaos-"):len(p.Prefix)-1])
	rep := Run(t, "sentinel-failover", p, load, 4*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 15*time.Second, 18*time.Second) {
			return ctx.Err()
		}
		down := time.Now()
		if err := set.Kill9(); err != nil {
			return err
		}
		// The script returns once the process is gone, which can take a
		// while after the kill itself.
		p.RecordFailover(down, time.Now())
		rec.Extra("kill_command", time.Since(down).Round(100*time.Millisecond))
		// The sentinels' verdict: a new primary.
		sc := redis.NewSentinelClient(&redis.Options{Addr: sentinelAddrs[0]})
		defer sc.Close()
		promoted := false
		for time.Since(down) < 30*time.Second {
			if addr, err := sc.GetMasterAddrByName(ctx, "kfpipe").Result(); err == nil &&
				strings.Join(addr, ":") != sentinelPrimary {
				promoted = true
				rec.Extra("new_primary_after", time.Since(down).Round(100*time.Millisecond))
				break
			}
			if !Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
				return ctx.Err()
			}
		}
		if !promoted {
			rec.Problem("no replica promoted within 30s")
		}
		for _, d := range p.Daemons() {
			if body, ok := waitReadyz(ctx, d, 200, 30*time.Second); !ok {
				rec.Problem("%s not ready 30s after the failover: %s", d.Tag(), body)
			}
		}
		rec.Extra("all_ready_after", time.Since(down).Round(100*time.Millisecond))
		// Dead letters from now on are indexed on the new primary.
		p.Sink.FailUser(failing)
		if !Pause(ctx, 5*time.Second, 8*time.Second) {
			return ctx.Err()
		}
		// Redeliveries for the new primary's dedup marks to absorb. The
		// victim is a consumer with users waiting on it, killed as a page
		// of messages goes out (as consumer-kill9 aims), so the kill tests
		// their stall: a fixed consumer killed at any moment found nobody.
		pages := pageSignal(p)
		defer p.OnSyncMsg(nil)
		c := busyConsumer(ctx, p, 10*time.Second)
		if err := awaitPage(ctx, pages); err != nil {
			return err
		}
		if _, err := c.Kill9(); err != nil {
			return err
		}
		if !Pause(ctx, 500*time.Millisecond, time.Second) {
			return ctx.Err()
		}
		return c.Restart(60 * time.Second)
	})
	if rep.DLQ == 0 {
		t.Errorf("sentinel-failover: no dead letter of %s reached the DLQ index after the failover", failing)
	}
}
