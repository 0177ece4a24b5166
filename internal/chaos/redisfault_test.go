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
		body, ok := waitReadyz(ctx, victim, http.StatusServiceUnavailable, 30*time.Second)
		if !ok {
			rec.Problem("cut-off consumer still ready 30 s after losing Redis (last: %s)", body)
		} else {
			rec.Extra("cut_unready_after", time.Since(cutAt).Round(100*time.Millisecond))
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
		if body, ok := waitReadyz(ctx, victim, http.StatusOK, 60*time.Second); !ok {
			rec.Problem("cut-off consumer not ready 60 s after its link healed (last: %s)", body)
		} else {
			rec.Extra("cut_ready_after_heal", time.Since(healAt).Round(100*time.Millisecond))
		}
		return nil
	})
}

// TestChaosKafkaSlow: the schedule-consumers reach a broker of the
// scenario's own only through a toxiproxy link (the broker's PROXIED
// listener advertises the link), which adds 200 ms to every answer for
// most of the run; the producer and the evidence talk to the broker
// directly. Nothing may be lost, repeated or reordered; reported: the
// end-to-end wait of the messages sent while the link was slow (p99, max)
// next to the whole run's. Full size only (a private broker).
func TestChaosKafkaSlow(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	fp := StartFaultProxy(t)
	kb, link := PrivateKafkaBehind(t, fp)
	const slowFor = 60 * time.Second
	var slowFrom, slowTo time.Time
	judge := func(ev *Evidence, rep *Report) {
		judgeWaits(ev, rep)
		var sent []Sent
		for _, s := range ev.Sent {
			if s.At.After(slowFrom) && s.At.Before(slowTo) {
				sent = append(sent, s)
			}
		}
		p99, max, n := waitsOf(ev, sent)
		if n == 0 {
			rep.Problem("no message sent while the link was slow")
			return
		}
		rep.Extra("slow_sent", n)
		rep.Extra("slow_wait_p99", p99.Round(10*time.Millisecond))
		rep.Extra("slow_max_wait", max.Round(10*time.Millisecond))
	}
	p := Start(t, Options{Brokers: kb.Addr, ConsumerBrokers: link.Listen, Redis: svc.Redis, Kcat: svc.Kcat,
		Consumers: 2, SinkSleep: time.Millisecond, Judge: judge})
	load := Load{Total: 20000, Users: 1000, Rate: 200}
	Run(t, "kafka-slow", p, load, 5*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 10*time.Second, 10*time.Second) {
			return ctx.Err()
		}
		if err := Latency(link, 200*time.Millisecond); err != nil {
			return err
		}
		slowFrom = time.Now()
		rec.Extra("latency", "200ms")
		rec.Extra("slow", slowFor)
		if !Pause(ctx, slowFor, slowFor) {
			return ctx.Err()
		}
		slowTo = time.Now()
		return Heal(link)
	})
}
