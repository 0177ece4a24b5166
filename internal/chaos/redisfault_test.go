package chaos

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosRedisSlowAndPartition: each schedule-consumer reaches Redis
// through its own toxiproxy link. Under steady load, every link gets
// 300 ms of latency (10 s reduced, 30 s full); later one consumer's link
// is blackholed (bytes stop, connections stay open) while the other keeps
// Redis. Judged: lost=0 dup=0 reordered=0 throughout; the cut-off
// consumer's /readyz names Redis within a few seconds and the other's
// stays ready; the cut-off consumer takes no effect it cannot protect (none
// later than the dedup lease after the cut, when no claim it took before
// can still be valid); it is ready again soon after the link heals.
// Reported: how long messages waited (wait_p99, max_wait) — the users of
// the cut-off consumer wait for the link to heal.
func TestChaosRedisSlowAndPartition(t *testing.T) {
	svc := NeedServices(t)
	fp := StartFaultProxy(t)
	links := map[string]*toxiclient.Proxy{}
	for _, n := range []string{"consumer-1", "consumer-2"} {
		links[n] = fp.Link(t, "redis-"+n+"-"+testenv.Short(), svc.Redis)
	}
	load := Size(Load{Total: 6000, Users: 300, Rate: 150}, Load{Total: 24000, Users: 1000, Rate: 200})
	slowFor := Size(10*time.Second, 30*time.Second)
	cutFor := Size(15*time.Second, 30*time.Second)
	var cutAt, healAt time.Time
	judge := func(ev *Evidence, rep *Report) {
		judgeWaits(ev, rep)
		// A claim taken before the cut protects its effect until the lease
		// ends; after that the consumer must not take effects at all.
		from := cutAt.Add(config.DefaultDedupLease + 2*time.Second)
		late := 0
		for _, d := range ev.Deliveries {
			if strings.HasPrefix(d.Tag, "consumer-1.") && d.At.After(from) && d.At.Before(healAt) {
				late++
			}
		}
		rep.Extra("cut_effects_after_lease", late)
		if late > 0 && healAt.After(from) {
			rep.Problem("the cut-off consumer took %d effects more than the dedup lease after losing Redis", late)
		}
	}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: 2 * time.Millisecond, Judge: judge,
		ConsumerRedis: func(name string) string { return links[name].Listen }})
	Run(t, "redis-slow-partition", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 3*time.Second, 3*time.Second) {
			return ctx.Err()
		}
		for _, l := range links {
			if err := Latency(l, 300*time.Millisecond); err != nil {
				return err
			}
		}
		if !Pause(ctx, slowFor, slowFor) {
			return ctx.Err()
		}
		for _, l := range links {
			if err := Heal(l); err != nil {
				return err
			}
		}
		rec.Extra("slow", slowFor)
		if !Pause(ctx, 3*time.Second, 3*time.Second) {
			return ctx.Err()
		}
		victim, other := p.Consumers[0], p.Consumers[1]
		if err := Blackhole(links["consumer-1"]); err != nil {
			return err
		}
		cutAt = time.Now()
		unready, body := waitReadiness(ctx, victim, false, 30*time.Second)
		if unready < 0 {
			rec.Problem("cut-off consumer still ready 30 s after losing Redis")
		} else {
			rec.Extra("cut_unready_after", unready.Round(100*time.Millisecond))
			if !strings.Contains(strings.ToLower(body), "redis") {
				rec.Problem("cut-off consumer's /readyz does not name Redis: %q", body)
			}
		}
		if code, body, err := other.Readyz(ctx); err != nil || code != http.StatusOK {
			rec.Problem("the consumer that kept Redis is not ready: %d %q %v", code, body, err)
		}
		if !Pause(ctx, time.Until(cutAt.Add(cutFor)), time.Until(cutAt.Add(cutFor))) {
			return ctx.Err()
		}
		if err := Heal(links["consumer-1"]); err != nil {
			return err
		}
		healAt = time.Now()
		rec.Extra("cut", cutFor)
		ready, _ := waitReadiness(ctx, victim, true, 60*time.Second)
		if ready < 0 {
			rec.Problem("cut-off consumer not ready 60 s after its link healed")
		} else {
			rec.Extra("cut_ready_after_heal", ready.Round(100*time.Millisecond))
		}
		return nil
	})
}

// waitReadiness polls d's /readyz until it is (ready) or is not (!ready)
// 200, and returns how long that took and the last body; -1 after
// timeout.
func waitReadiness(ctx context.Context, d *Daemon, ready bool, timeout time.Duration) (time.Duration, string) {
	start := time.Now()
	body := ""
	for time.Since(start) < timeout {
		code, b, err := d.Readyz(ctx)
		body = b
		if err == nil && (code == http.StatusOK) == ready {
			return time.Since(start), body
		}
		if !Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
			break
		}
	}
	return -1, body
}
