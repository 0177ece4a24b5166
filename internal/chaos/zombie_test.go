package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

// TestChaosConsumerZombie: two schedule-consumers in one group under load;
// the busier one is frozen (SIGSTOP) for longer than the session timeout
// and the lease — the group gives its partitions to the other, which takes
// their leases after they expired — and then thawed (SIGCONT). The zombie
// wakes with handlers mid-flight and an old view of its partitions: it
// must start nothing new (its lease's deadline passed on its own clock),
// its late marks are facts the new owner reads, and what it still sends
// carries its old fencing token. The Sink keeps the newest token per user,
// as a downstream that uses the token does, and refuses older ones
// (fenced_refused). Every message must have its effect once and in order,
// and the zombie's users wait at most twice the session timeout, with the
// shipped timings (session timeout, lease, commit interval).
//
// It runs in make chaos only: make test's cover of the same rules is the
// state store's (TestHole1FencedMarkIsRecorded, TestMarkerFenced) and the
// consumer's (TestPausedPartitionRevokedAndReassignedResumes,
// TestHandlerGetsFencingToken), and consumer-kill9's hand-over.
func TestChaosConsumerZombie(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	load := Load{Total: 40000, Users: 1000, Rate: 500}
	freezes := 2
	frozenFor := config.DefaultSessionTimeout + config.DefaultDedupLease // past both
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: 2 * time.Millisecond, StallLimit: 2 * config.DefaultSessionTimeout,
		ConsumerEnv: map[string]string{"KFPIPE_KAFKA_CONSUMER_COMMIT_INTERVAL": "1s"}})
	p.Sink.Fence(true)
	p.Opts.Judge = func(_ *Evidence, rep *Report) { rep.Extra("fenced_refused", p.Sink.Fenced()) }
	feedFor := time.Duration(float64(load.Total)/load.Rate) * time.Second
	Run(t, "consumer-zombie", p, load, 3*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		gap := (feedFor - time.Duration(freezes)*frozenFor) / time.Duration(freezes+1)
		pages := pageSignal(p)
		defer p.OnSyncMsg(nil)
		for range freezes {
			if !Pause(ctx, gap/2, gap) {
				return ctx.Err()
			}
			// Aimed like consumer-kill9's kills: at the consumer with users
			// waiting on it, as a page of messages goes out.
			victim := busyConsumer(ctx, p, 10*time.Second)
			if err := awaitPage(ctx, pages); err != nil {
				return err
			}
			if _, err := victim.Freeze(); err != nil {
				return err
			}
			paused := Pause(ctx, frozenFor, frozenFor)
			if err := victim.Thaw(); err != nil {
				return err
			}
			if !paused {
				return ctx.Err()
			}
		}
		return nil
	})
}
