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
// Redis. Judged: lost=0 dup=0 reordered=0 throughout — a repeat of an
// effect the cut-off consumer made in the second before the cut, whose
// done mark was in flight, is a dup too (cut_window_effects counts those
// effects: the message was finished when its handler returned and its
// offset listed in the commit, see docs/reliability.md); the cut-off
// consumer's /readyz names Redis within a few seconds and the other's
// stays ready; the cut-off consumer takes no effect it cannot protect (none
// later than the dedup lease after the cut, when no claim it took before
// can still be valid); it is ready again soon after the link heals.
// The cut-off consumer leaves its group after
// processor.standby_after_redis_lost (shortened to 5 s in the reduced run,
// the shipped value in the full one) so that its users are served by the
// other: messages sent once that happened must have their effect before
// the link heals; after the heal it joins again. Reported: how long
// messages waited (wait_p99, max_wait).
func TestChaosRedisSlowAndPartition(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	svc := NeedServices(t)
	fp := StartFaultProxy(t)
	links := map[string]*toxiclient.Proxy{}
	for _, n := range []string{"consumer-1", "consumer-2"} {
		links[n] = fp.Link(t, "redis-"+n+"-"+testenv.Short(), svc.Redis)
	}
	load := Size(Load{Total: 10000, Users: 300, Rate: 150}, Load{Total: 24000, Users: 1000, Rate: 200})
	slowFor := Size(10*time.Second, 30*time.Second)
	cutFor := Size(45*time.Second, 75*time.Second)
	// The full run keeps the shipped processor.standby_after_redis_lost.
	standbyAfter := Size(5*time.Second, config.DefaultStandbyAfterRedisLost)
	var consumerEnv map[string]string
	if !Full() {
		consumerEnv = map[string]string{"KFPIPE_PROCESSOR_STANDBY_AFTER_REDIS_LOST": standbyAfter.String()}
	}
	var cutAt, healAt time.Time
	judge := func(ev *Evidence, rep *Report) {
		judgeWaits(ev, rep)
		// Once the cut-off consumer stood by and its partitions moved (its
		// claims then expire within the lease), its users are served by
		// the consumer that has Redis: what they send then is handled
		// before the link heals.
		from, to := cutAt.Add(standbyAfter+25*time.Second), healAt.Add(-2*time.Second)
		var sent []Sent
		for _, s := range ev.Sent {
			if s.At.After(from) && s.At.Before(to) {
				sent = append(sent, s)
			}
		}
		first := map[string]time.Time{}
		for _, d := range ev.Deliveries {
			if at, ok := first[d.MsgID]; !ok || d.At.Before(at) {
				first[d.MsgID] = d.At
			}
		}
		waiting := 0
		for _, s := range sent {
			if at, ok := first[s.MsgID]; !ok || !at.Before(healAt) {
				waiting++
			}
		}
		rep.Extra("sent_during_standby", len(sent))
		rep.Extra("served_after_heal", waiting)
		if len(sent) == 0 {
			rep.Problem("no message sent while the cut-off consumer stood by: the check proves nothing")
		} else if waiting > 0 {
			rep.Problem("%d of %d messages sent while the cut-off consumer stood by waited for its link to heal", waiting, len(sent))
		}
		// A claim taken before the cut protects its effect until the lease
		// ends; after that the consumer must not take effects at all.
		from = cutAt.Add(config.DefaultDedupLease + 2*time.Second)
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
		SinkSleep: 2 * time.Millisecond, Judge: judge, ConsumerEnv: consumerEnv,
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
		// The done marks in flight when the link went never reach Redis
		// and their claims expire; the commit's list of finished offsets
		// keeps the other consumer from running those handlers again.
		p.RecordCut(victim.Tag(), cutAt)
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
		if waitMetric(ctx, victim, "kfpipe_consumer_standby", 1, standbyAfter+30*time.Second) {
			rec.Extra("standby_after", time.Since(cutAt).Round(100*time.Millisecond))
		} else {
			rec.Problem("cut-off consumer did not leave its group within %s", standbyAfter+30*time.Second)
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
		if !waitMetric(ctx, victim, "kfpipe_consumer_standby", 0, 30*time.Second) {
			rec.Problem("cut-off consumer did not join its group again within 30 s of the link healing")
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

// waitMetric polls d's /metrics until series equals want; false after
// timeout.
func waitMetric(ctx context.Context, d *Daemon, series string, want float64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if v, err := d.Metric(ctx, series); err == nil && v == want {
			return true
		}
		if !Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
			return false
		}
	}
	return false
}

// TestChaosRedisSlowProducer: kf-producer reaches Redis (sync lock,
// cursors, token cache) only through a toxiproxy link: 300 ms on every
// answer for 30 s, then the link blackholed for 30 s while callbacks keep
// arriving. Judged: lost=0 dup=0 reordered=0; the producer's /readyz
// names Redis within a few seconds of the cut and is 200 again after the
// heal; messages that arrived upstream during the cut are synced after
// it (none lost, none twice). Full size only.
func TestChaosRedisSlowProducer(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	fp := StartFaultProxy(t)
	link := fp.Link(t, "redis-producer-"+testenv.Short(), svc.Redis)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1,
		SinkSleep: time.Millisecond, ProducerRedis: link.Listen, Judge: judgeWaits})
	load := Load{Total: 15000, Users: 500, Rate: 150}
	Run(t, "redis-slow-producer", p, load, 5*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		if err := Latency(link, 300*time.Millisecond); err != nil {
			return err
		}
		rec.Extra("slow", "30s")
		if !Pause(ctx, 30*time.Second, 30*time.Second) {
			return ctx.Err()
		}
		if err := Heal(link); err != nil {
			return err
		}
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		if err := Blackhole(link); err != nil {
			return err
		}
		cut := time.Now()
		rec.Extra("cut", "30s")
		if body, ok := waitReadyz(ctx, p.Producer, http.StatusServiceUnavailable, 30*time.Second); !ok {
			rec.Problem("kf-producer still ready 30 s after losing Redis (last: %s)", body)
		} else {
			rec.Extra("producer_unready_after", time.Since(cut).Round(100*time.Millisecond))
			if !strings.Contains(strings.ToLower(body), "redis") {
				rec.Problem("kf-producer's /readyz does not name Redis: %q", body)
			}
		}
		if !Pause(ctx, time.Until(cut.Add(30*time.Second)), time.Until(cut.Add(30*time.Second))) {
			return ctx.Err()
		}
		if err := Heal(link); err != nil {
			return err
		}
		healed := time.Now()
		if body, ok := waitReadyz(ctx, p.Producer, http.StatusOK, 60*time.Second); !ok {
			rec.Problem("kf-producer not ready 60 s after its Redis link healed (last: %s)", body)
		} else {
			rec.Extra("producer_ready_after_heal", time.Since(healed).Round(100*time.Millisecond))
		}
		return nil
	})
}
