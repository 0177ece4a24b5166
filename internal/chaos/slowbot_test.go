package chaos

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"

	"testing"

	"github.com/kfpipe/kfpipe/internal/config"
)

// TestChaosSlowBot: the journey of an LLM-backed bot through what a
// deployment does every day. Shipped defaults, except the attempt timeout
// (and the http handler's request timeout) raised above the bot's slowest
// answer, as docs/handlers.md tells a slow bot's author; the bot answers
// in 5–30 s (reduced: 1–3 s), replies once to each message (the fake
// WeChat counts replies by msgid), and fails fast the first attempt of 30%
// of the messages. During the run: a rolling restart of every consumer
// (SIGTERM, start), a scale-out and a scale-in, and one consumer frozen
// (SIGSTOP) past its partitions' lease and resumed. Every effect and every
// reply must happen once and in order, and every SIGTERM must hand its
// partitions over and exit 0 within kafka.consumer.revoke_drain_limit and
// a few seconds. The line says how many running handlers the hand-overs
// awaited, cancelled, or left to a lapsing lease.
func TestChaosSlowBot(t *testing.T) {
	svc := NeedServices(t)
	lo, hi := Size(time.Second, 5*time.Second), Size(3*time.Second, 30*time.Second)
	// At most 4 messages a customer, as in the field run: WeChat refuses a
	// sixth reply since the customer's last message (95001), and a slow
	// bot answers a burst only after it ended.
	load := Size(Load{Total: 160, Users: 40, Rate: 8, MaxPerUser: 4}, Load{Total: 800, Users: 200, Rate: 4, MaxPerUser: 4})
	attemptTimeout := 2 * hi
	drainLimit := 10 * time.Second // kafka.consumer.revoke_drain_limit's default
	stopBound := drainLimit + 5*time.Second
	consumers := Size(2, 3)
	// The frozen consumer's requests already at the bot finish during the
	// freeze, without their marks, as a killed one's do: the in-flight
	// window the judge allows is the bot's slowest answer.
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: consumers + 1, Replies: true,
		InFlightSlack: hi + 2*time.Second,
		// The freeze tests the ownership past the lease, not a user's
		// stall (consumer-zombie does): with a bot this slow an
		// incarnation has made few effects when it is frozen, and the
		// judge's count of users waiting on it is often 0.
		KillsNotForStalls: true,
		ConsumerEnv: map[string]string{
			"KFPIPE_PROCESSOR_ATTEMPT_TIMEOUT": attemptTimeout.String(),
			"KFPIPE_HANDLER_HTTP_TIMEOUT":      attemptTimeout.String(),
		}})
	p.Sink.SlowBot(lo, hi, 0.3)
	spare := p.Consumers[consumers] // the scale-out's
	var stops []string
	stop := func(d *Daemon, rec *Report) {
		start := time.Now()
		err := d.Stop(stopBound + 10*time.Second)
		took := time.Since(start)
		stops = append(stops, fmt.Sprintf("%s:%s", d.Name, took.Round(100*time.Millisecond)))
		switch {
		case err != nil:
			rec.Problem("SIGTERM %s: %v", d.Name, err)
		case took > stopBound:
			rec.Problem("SIGTERM %s took %s, want within %s (revoke_drain_limit + 5 s)", d.Name, took.Round(time.Millisecond), stopBound)
		}
	}
	p.Opts.Judge = func(_ *Evidence, rep *Report) {
		var awaited, cancelled, lapsed int
		for _, d := range p.Consumers {
			a, c, l := handOvers(d)
			awaited, cancelled, lapsed = awaited+a, cancelled+c, lapsed+l
		}
		rep.Extra("handlers_awaited", awaited)
		rep.Extra("handlers_cancelled", cancelled)
		rep.Extra("handlers_left_to_lapse", lapsed)
		rep.Extra("bot_calls_abandoned", p.Sink.Abandoned())
		rep.Extra("sigterm_stops", len(stops))
		t.Logf("slow-bot: SIGTERM stops %v", stops)
	}
	Run(t, "slow-bot", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		// The spare starts out of the group (a scale-in before the load).
		stop(spare, rec)
		if !Pause(ctx, 2*hi, 2*hi) {
			return ctx.Err()
		}
		// Rolling restart: one consumer at a time, SIGTERM then start.
		for _, d := range p.Consumers[:consumers] {
			stop(d, rec)
			if err := d.Restart(time.Minute); err != nil {
				return err
			}
			if !Pause(ctx, hi, hi) {
				return ctx.Err()
			}
		}
		// Scale-out.
		if err := spare.Restart(time.Minute); err != nil {
			return err
		}
		if !Pause(ctx, hi, hi) {
			return ctx.Err()
		}
		// One consumer frozen past its lease (and the grace), then resumed:
		// the one users wait on (aimed like consumer-zombie's freezes).
		victim := busyConsumer(ctx, p, 10*time.Second)
		if _, err := victim.Freeze(); err != nil {
			return err
		}
		paused := Pause(ctx, config.DefaultDedupLease*3/2, config.DefaultDedupLease*3/2)
		if err := victim.Thaw(); err != nil {
			return err
		}
		if !paused || !Pause(ctx, hi, hi) {
			return ctx.Err()
		}
		// Scale-in.
		stop(spare, rec)
		return nil
	})
}

var handOverField = regexp.MustCompile(`"(awaited|cancelled|left_to_lapsing_lease)":\s*(\d+)`)

// handOvers sums, over every incarnation's log of d, what its hand-overs
// (revokes and stops) did with the handler attempts running then.
func handOvers(d *Daemon) (awaited, cancelled, lapsed int) {
	d.mu.Lock()
	logs := append([]string(nil), d.logs...)
	d.mu.Unlock()
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range regexp.MustCompile(`(?m)^.*handler attempts ended.*$`).FindAllString(string(b), -1) {
			for _, m := range handOverField.FindAllStringSubmatch(line, -1) {
				n, _ := strconv.Atoi(m[2])
				switch m[1] {
				case "awaited":
					awaited += n
				case "cancelled":
					cancelled += n
				default:
					lapsed += n
				}
			}
		}
	}
	return awaited, cancelled, lapsed
}
