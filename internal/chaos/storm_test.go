package chaos

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

// TestChaosScaleStorm: under steady load the consumer group is scaled
// 1 → 4 → 2 → 4 → 1 processes (started, and stopped with SIGTERM, a few
// seconds apart; cooperative-sticky rebalances), and on the way back to 4
// one consumer is SIGKILLed the moment it starts giving up partitions to
// the newcomer (its revoke counter moved). Every message's effect must
// happen once (a repeat only inside the killed process's crash window),
// each user's in order, and no SIGTERM may hang or fail. Reported: the
// rebalance events the consumers logged, whether the kill landed inside a
// revoke, and how long messages waited from being sent to their effect
// (p99 and max: the longest per-user stall the storm caused).
func TestChaosScaleStorm(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	svc := NeedServices(t)
	load := Size(Load{Total: 6000, Users: 300, Rate: 200}, Load{Total: 30000, Users: 1000, Rate: 250})
	gap := Size(3*time.Second, 8*time.Second)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 4, Partitions: 8, KillsNotForStalls: true,
		SinkSleep: 2 * time.Millisecond, StallLimit: 2 * config.DefaultSessionTimeout,
		// The shipped timings otherwise, as in consumer-kill9.
		ConsumerEnv: map[string]string{"KFPIPE_KAFKA_CONSUMER_COMMIT_INTERVAL": "1s", "KFPIPE_PROCESSOR_IDLE_TIMEOUT": "2m"},
		Judge:       judgeWaits,
	})
	cs := p.Consumers
	const stopTimeout = 40 * time.Second
	stop := func(ds ...*Daemon) error {
		for _, d := range ds {
			if err := d.Stop(stopTimeout); err != nil {
				return err
			}
			if !Pause(context.Background(), gap/4, gap/2) {
				return nil
			}
		}
		return nil
	}
	start := func(ds ...*Daemon) error {
		for _, d := range ds {
			if err := d.Restart(90 * time.Second); err != nil {
				return err
			}
			Pause(context.Background(), gap/4, gap/2)
		}
		return nil
	}
	Run(t, "scale-storm", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		// Start() brought all four up; the storm begins from one.
		if err := stop(cs[1], cs[2], cs[3]); err != nil { // → 1
			return err
		}
		if !Pause(ctx, gap, gap) {
			return ctx.Err()
		}
		if err := start(cs[1], cs[2], cs[3]); err != nil { // → 4
			return err
		}
		if !Pause(ctx, gap, gap) {
			return ctx.Err()
		}
		if err := stop(cs[2], cs[3]); err != nil { // → 2
			return err
		}
		if !Pause(ctx, gap, gap) {
			return ctx.Err()
		}
		if err := start(cs[2]); err != nil { // → 3
			return err
		}
		// → 4, with a SIGKILL aimed at a member that is revoking
		// partitions for the newcomer.
		landed, err := killInRevoke(ctx, cs[:3], func() error { return cs[3].Start() })
		if err != nil {
			return err
		}
		rec.Extra("kill_in_revoke", landed)
		if err := cs[3].WaitReady(90 * time.Second); err != nil {
			return err
		}
		for _, d := range cs[:3] {
			if !d.Running() {
				if err := d.Restart(90 * time.Second); err != nil {
					return err
				}
			}
		}
		if !Pause(ctx, gap, gap) {
			return ctx.Err()
		}
		if err := stop(cs[0], cs[1], cs[3]); err != nil { // → 1
			return err
		}
		assigned, revoked := 0, 0
		for _, d := range cs {
			assigned += d.CountLog("partitions assigned")
			revoked += d.CountLog("partitions revoked")
		}
		rec.Extra("rebalances", fmt.Sprintf("%d(assign %d, revoke %d)", assigned+revoked, assigned, revoked))
		if assigned < 8 {
			rec.Problem("only %d assignments logged: the storm did not rebalance the group", assigned)
		}
		return nil
	})
}

// killInRevoke runs join (a new member joining the group) and SIGKILLs the
// first of members whose revoke counter moves after it — a consumer in
// the middle of giving partitions up. Without a revoke within 20 s the
// last member is killed anyway; landed says which happened.
func killInRevoke(ctx context.Context, members []*Daemon, join func() error) (landed bool, err error) {
	const series = `kfpipe_rebalances_total{type="revoke"}`
	before := make([]float64, len(members))
	for i, d := range members {
		if before[i], err = d.Metric(ctx, series); err != nil {
			return false, err
		}
	}
	if err := join(); err != nil {
		return false, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for i, d := range members {
			v, err := d.Metric(ctx, series)
			if err == nil && v > before[i] {
				_, err := d.Kill9()
				return true, err
			}
		}
		if !Pause(ctx, 10*time.Millisecond, 10*time.Millisecond) {
			return false, ctx.Err()
		}
	}
	_, err = members[len(members)-1].Kill9()
	return false, err
}

// judgeWaits reports how long messages waited from being sent to their
// first effect: the p99 and the longest wait of the run.
func judgeWaits(ev *Evidence, rep *Report) {
	p99, max, n := waitsOf(ev, ev.Sent)
	if n == 0 {
		rep.Problem("no effects to measure waits on")
		return
	}
	rep.Extra("wait_p99", p99.Round(10*time.Millisecond))
	rep.Extra("max_wait", max.Round(10*time.Millisecond))
}

// waitsOf returns the p99 and the longest of the waits from sending to
// first effect of sent's messages that had an effect, and how many had.
func waitsOf(ev *Evidence, sent []Sent) (p99, max time.Duration, n int) {
	first := map[string]time.Time{}
	for _, d := range ev.Deliveries {
		if at, ok := first[d.MsgID]; !ok || d.At.Before(at) {
			first[d.MsgID] = d.At
		}
	}
	var waits []time.Duration
	for _, s := range sent {
		if at, ok := first[s.MsgID]; ok {
			waits = append(waits, at.Sub(s.At))
		}
	}
	if len(waits) == 0 {
		return 0, 0, 0
	}
	slices.Sort(waits)
	return waits[len(waits)*99/100], waits[len(waits)-1], len(waits)
}
