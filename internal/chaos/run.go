package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// Load is the traffic of a scenario.
type Load struct {
	Total int     // messages
	Users int     // distinct users
	Rate  float64 // messages a second
	// MaxPerUser, when set, caps one user's messages (users are picked at
	// random otherwise, so some send many more than Total/Users).
	MaxPerUser int
	// BotPerMin, when set, adds a bot: one user sending this many
	// messages a minute for as long as the load is fed.
	BotPerMin float64
}

// Fault injects a fault while the load runs. It records what it observed
// (readiness, cursors) on rec with Extra and Problem, and returns when the
// system has been given back its parts (restarted, resumed). A returned
// error fails the scenario.
type Fault func(ctx context.Context, p *Pipeline, rec *Report) error

// Run feeds load through p while fault runs, waits until the system
// settled (at most settle after feeding ended), collects the evidence,
// stops every daemon (a hang on SIGTERM is a problem), and finishes with
// the scenario line.
func Run(t *testing.T, name string, p *Pipeline, load Load, settle time.Duration, fault Fault) *Report {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFeeder(p, load.Users)
	f.maxPerUser = load.MaxPerUser
	p.feeder = f
	rec := &Report{Name: name}
	start := time.Now()
	fed := make(chan error, 1)
	botCtx, stopBot := context.WithCancel(ctx)
	botDone := make(chan struct{})
	go func() {
		defer close(botDone)
		if load.BotPerMin > 0 {
			f.Bot(botCtx, p.BotName(), load.BotPerMin)
		}
	}()
	go func() {
		err := f.Feed(ctx, load.Total, load.Rate)
		stopBot()
		<-botDone
		fed <- err
	}()
	faultDone := make(chan error, 1)
	go func() {
		sent := false
		defer func() {
			// A fault that calls t.Fatal (or runtime.Goexit) ends this
			// goroutine without returning; the run must not wait forever.
			if !sent {
				faultDone <- errors.New("the fault ended without returning (t.Fatal in the fault's goroutine?)")
			}
		}()
		var err error
		if fault != nil {
			err = fault(ctx, p, rec)
		}
		sent = true
		faultDone <- err
	}()
	if err := <-fed; err != nil {
		t.Errorf("%s: feeding: %v", name, err)
	}
	if err := <-faultDone; err != nil {
		rec.Problem("fault: %v", err)
	}
	fedAt := time.Now()
	settleErr := p.Settle(ctx, f, settle)
	elapsed := time.Since(start)
	t.Logf("%s: fed and faults done in %s, settled %s later", name, fedAt.Sub(start).Round(time.Millisecond),
		time.Since(fedAt).Round(time.Millisecond))
	collectAt := time.Now()
	ev, err := p.Collect(ctx, f)
	if err != nil {
		t.Fatalf("%s: collect evidence: %v", name, err)
	}
	t.Logf("%s: evidence collected in %s", name, time.Since(collectAt).Round(time.Millisecond))
	rep := ev.Report(name, elapsed)
	rep.absorb(rec)
	if p.Opts.Judge != nil {
		p.Opts.Judge(ev, rep)
	}
	if settleErr != nil {
		rep.note("%v", settleErr)
	}
	ok, failed := f.Callbacks()
	rep.Extra("callbacks", ok)
	if failed > 0 {
		rep.Extra("callbacks_unanswered", failed)
	}
	stopAt := time.Now()
	for _, e := range p.StopAll(15 * time.Second) {
		rep.Problem("shutdown: %s", e)
	}
	t.Logf("%s: daemons stopped in %s", name, time.Since(stopAt).Round(time.Millisecond))
	Finish(t, rep)
	return rep
}

// Pause sleeps a random duration in [lo, hi]; false when ctx ended.
func Pause(ctx context.Context, lo, hi time.Duration) bool {
	d := lo
	if hi > lo {
		d += rand.N(hi - lo)
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
