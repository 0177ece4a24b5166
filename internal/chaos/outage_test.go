package chaos

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestChaosDownstreamOutage: the consumers' downstream (the Sink) answers
// 503 to every message for a while under steady load, with the shipped
// gate settings (outage.*) and retry settings. No message may be
// dead-lettered with a retryable reason — the consumers hold them and
// probe — and after the downstream is back every message has its effect
// once, in order. The Redis memory of the run's keys is sampled before,
// at the end of and after the outage (it must not grow with the stream).
func TestChaosDownstreamOutage(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	downstreamOutage(t, "downstream-outage", false)
}

// TestChaosDownstreamOutageFailingUser is downstream-outage with one user
// whose downstream fails all the time, before, during and after the
// outage: that user's messages are still dead-lettered (its own
// failures, its own breaker), nobody else's.
func TestChaosDownstreamOutageFailingUser(t *testing.T) {
	// make test: the gate's tests in internal/consumer, among them
	// TestOutageHoldsMessagesInsteadOfDeadLettering on the real broker.
	SkipUnlessFull(t)
	downstreamOutage(t, "downstream-outage-failing-user", true)
}

func downstreamOutage(t *testing.T, name string, failingUser bool) {
	svc := NeedServices(t)
	load := Size(Load{Total: 4000, Users: 300, Rate: 100}, Load{Total: 15000, Users: 1000, Rate: 100})
	outage := Size(20*time.Second, 60*time.Second)
	var broken string
	// The dead letters: none with a retryable reason, except the broken
	// user's, which must have them.
	judge := func(ev *Evidence, rep *Report) {
		others, brokenLetters := 0, 0
		for _, ls := range ev.DLQ {
			for _, l := range ls {
				switch {
				case broken != "" && l.User == broken:
					brokenLetters++
				case l.Reason == "downstream_error" || l.Reason == "process_timeout" || l.Reason == "circuit_open":
					others++
					if others <= 5 {
						rep.note("%s of %s dead-lettered as %s during a shared outage", l.MsgID, l.User, l.Reason)
					}
				}
			}
		}
		rep.Extra("retryable_dead_letters", others)
		if others > 0 {
			rep.Problem("%d messages dead-lettered because of the shared outage", others)
		}
		if broken != "" {
			rep.Extra("failing_user_dead_letters", brokenLetters)
			if brokenLetters == 0 {
				rep.Problem("the always-failing user %s was not dead-lettered", broken)
			}
		}
	}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: time.Millisecond, Judge: judge})
	if failingUser {
		broken = p.UserName(0)
		p.Sink.FailUser(broken)
	}
	feedFor := time.Duration(float64(load.Total)/load.Rate) * time.Second
	Run(t, name, p, load, Size(2*time.Minute, 4*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, (feedFor-outage)/3, (feedFor-outage)/3) {
			return ctx.Err()
		}
		keysBefore, memBefore, err := p.KeyMemory(ctx)
		if err != nil {
			return err
		}
		p.Sink.Down(true)
		start := time.Now()
		// /readyz tells the truth within a few seconds, and stays 200.
		sawGate := false
		for time.Since(start) < outage {
			if !Pause(ctx, time.Second, time.Second) {
				return ctx.Err()
			}
			for _, c := range p.Consumers {
				if code, body, err := c.Readyz(ctx); err == nil && code == 200 && strings.Contains(body, "downstream gate open") {
					if !sawGate {
						rec.Extra("gate_seen_after", time.Since(start).Round(time.Second))
					}
					sawGate = true
				}
			}
		}
		keysDuring, memDuring, err := p.KeyMemory(ctx)
		if err != nil {
			return err
		}
		calls := p.Sink.Down(false)
		if !sawGate {
			rec.Problem("no consumer's /readyz said the downstream gate was open during the outage")
		}
		rec.Extra("outage", outage)
		rec.Extra("sink_503", calls)
		rec.Extra("redis_keys_before", keysBefore)
		rec.Extra("redis_keys_end_of_outage", keysDuring)
		rec.Extra("redis_kib_before", memBefore>>10)
		rec.Extra("redis_kib_end_of_outage", memDuring>>10)
		return nil
	})
}
