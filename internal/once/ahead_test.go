package once

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// runTicket runs DoTicket with marked and waits for marked when DoTicket
// says it will be called; it returns the status and the mark's outcome.
func runTicket(t *testing.T, c *Client, ctx context.Context, tk *Ticket, f func(context.Context) error) (Status, error) {
	t.Helper()
	markc := make(chan error, 2)
	st, err := c.DoTicket(ctx, tk, time.Hour, f, Hooks{Marked: func(err error) { markc <- err }})
	if err != nil || st != StatusExecuted {
		select {
		case merr := <-markc:
			t.Fatalf("marked(%v) called after DoTicket = %v, %v", merr, st, err)
		default:
		}
		return st, err
	}
	select {
	case merr := <-markc:
		select {
		case again := <-markc:
			t.Fatalf("marked called twice (%v, %v)", merr, again)
		case <-time.After(20 * time.Millisecond):
		}
		return st, merr
	case <-ctx.Done():
		t.Fatal("marked was never called")
	}
	return st, nil
}

// Claims taken ahead run each f once, leave every key done, and make a
// later Do of the same keys a duplicate; a key already done is a duplicate
// without f.
func TestClaimAheadRunsEachKeyOnce(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		ctx := ctxT(t, 10*time.Second)
		if err := fx.c.Do(ctx, "done-before", time.Hour, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "done-before", "c"}
		ts := fx.c.ClaimAhead(ctx, keys)
		for i, k := range keys {
			v, err := fx.rdb.Get(ctx, fx.prefix+k).Result()
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			if want := k == "done-before"; (v == donePrefix) != want {
				t.Fatalf("after ClaimAhead %s = %q", k, v)
			}
			if ts[i].Key() != k {
				t.Fatalf("ticket %d key %q", i, ts[i].Key())
			}
		}
		var runs atomic.Int32
		for i, tk := range ts {
			st, err := runTicket(t, fx.c, ctx, tk, func(context.Context) error { runs.Add(1); return nil })
			want := StatusExecuted
			if keys[i] == "done-before" {
				want = StatusDuplicate
			}
			if err != nil || st != want {
				t.Fatalf("%s: DoTicket = %v, %v; want %v", keys[i], st, err, want)
			}
			if v, _ := fx.rdb.Get(ctx, fx.prefix+keys[i]).Result(); v != donePrefix {
				t.Fatalf("%s = %q after its mark, want done", keys[i], v)
			}
		}
		if runs.Load() != 3 {
			t.Fatalf("f ran %d times, want 3", runs.Load())
		}
		for _, k := range keys {
			st, err := fx.c.DoStatus(ctx, k, time.Hour, func(context.Context) error { runs.Add(1); return nil })
			if err != nil || st != StatusDuplicate {
				t.Fatalf("Do(%s) after = %v, %v", k, st, err)
			}
		}
	})
}

// A key claimed by someone else when ClaimAhead ran is waited on, never
// treated as done: DoTicket returns a duplicate only after the other call
// marked it done.
func TestClaimAheadWaitsForOthersClaim(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		ctx := ctxT(t, 10*time.Second)
		started, release := make(chan struct{}), make(chan struct{})
		otherDone := make(chan error, 1)
		go func() {
			otherDone <- fx.c.Do(ctx, "k", time.Hour, func(context.Context) error {
				close(started)
				<-release
				return nil
			})
		}()
		<-started
		ts := fx.c.ClaimAhead(ctx, []string{"k"})
		var ran atomic.Bool
		res := make(chan Status, 1)
		go func() {
			st, err := fx.c.DoTicket(ctx, ts[0], time.Hour, func(context.Context) error { ran.Store(true); return nil }, Hooks{})
			if err != nil {
				t.Errorf("DoTicket: %v", err)
			}
			res <- st
		}()
		select {
		case st := <-res:
			t.Fatalf("DoTicket returned %v while the other call still ran", st)
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		if err := <-otherDone; err != nil {
			t.Fatal(err)
		}
		if st := <-res; st != StatusDuplicate || ran.Load() {
			t.Fatalf("DoTicket = %v (f ran: %v), want duplicate without f", st, ran.Load())
		}
	})
}

// Release frees claims that will not be run, so another caller runs the
// key at once instead of waiting for the lease; a released ticket's key
// that someone else claimed meanwhile is not touched.
func TestReleaseFreesUnusedClaims(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, func(c *Config) { c.Lease = time.Minute })
		ctx := ctxT(t, 10*time.Second)
		ts := fx.c.ClaimAhead(ctx, []string{"x", "y"})
		fx.c.Release(ts...)
		deadline := time.Now().Add(5 * time.Second)
		for fx.rdb.Exists(ctx, fx.prefix+"x", fx.prefix+"y").Val() != 0 {
			if time.Now().After(deadline) {
				t.Fatal("released claims still present")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := fx.c.Do(ctx, "x", time.Hour, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		// A second Release of the same (spent) tickets leaves x done.
		fx.c.Release(ts...)
		time.Sleep(50 * time.Millisecond)
		if v, _ := fx.rdb.Get(ctx, fx.prefix+"x").Result(); v != donePrefix {
			t.Fatalf("x = %q after a stale release, want done", v)
		}
	})
}

// A claim taken ahead long enough ago is renewed before f runs; one that
// was lost meanwhile (expired and taken by someone else) is not run under:
// DoTicket waits for the new owner like any caller.
func TestTicketOldClaimRenewedOrLost(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		const lease = time.Second // room for a loaded machine's stalls
		fx := newFixture(t, m, func(c *Config) { c.Lease = lease })
		ctx := ctxT(t, 10*time.Second)
		ts := fx.c.ClaimAhead(ctx, []string{"renew", "lost"})
		time.Sleep(lease / 2) // past a third of the lease
		st, err := runTicket(t, fx.c, ctx, ts[0], func(context.Context) error {
			if ttl := fx.rdb.PTTL(ctx, fx.prefix+"renew").Val(); ttl < lease*3/5 {
				t.Errorf("claim not renewed before f: PTTL %v", ttl)
			}
			return nil
		})
		if err != nil || st != StatusExecuted {
			t.Fatalf("renew: %v, %v", st, err)
		}
		// "lost": the claim is replaced by someone else's (as after expiry).
		fx.rdb.Set(ctx, fx.prefix+"lost", processingPrefix+"someone-else", time.Second)
		var ran atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			st, err := fx.c.DoTicket(ctx, ts[1], time.Hour, func(context.Context) error { ran.Store(true); return nil }, Hooks{})
			if err != nil || st != StatusExecuted {
				t.Errorf("lost: %v, %v", st, err)
			}
		}()
		time.Sleep(100 * time.Millisecond)
		if ran.Load() {
			t.Fatal("f ran under someone else's claim")
		}
		<-done // someone else's claim expires after 1 s; then ours runs
		if !ran.Load() {
			t.Fatal("f never ran after the other claim expired")
		}
	})
}

// f failing under a ticket releases the key (no done mark, marked not
// called), so a retry runs it.
func TestTicketFailureReleases(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		ctx := ctxT(t, 10*time.Second)
		boom := errors.New("boom")
		ts := fx.c.ClaimAhead(ctx, []string{"k"})
		st, err := runTicket(t, fx.c, ctx, ts[0], func(context.Context) error { return boom })
		if !errors.Is(err, boom) || st != StatusExecuted {
			t.Fatalf("DoTicket = %v, %v; want boom", st, err)
		}
		if n := fx.rdb.Exists(ctx, fx.prefix+"k").Val(); n != 0 {
			t.Fatal("key still claimed after f failed")
		}
		st, err = fx.c.DoStatus(ctx, "k", time.Hour, func(context.Context) error { return nil })
		if err != nil || st != StatusExecuted {
			t.Fatalf("retry = %v, %v", st, err)
		}
	})
}

// The asynchronous done mark is retried after a failure; marked reports
// nil only once the key is done, and f does not run again.
func TestTicketAsyncMarkRetried(t *testing.T) {
	requireSetGet(t)
	fx := newFixture(t, mode{batch: true}, nil)
	hook := &failNext{}
	hook.left.Store(2)
	fx.rdb.AddHook(hook)
	ctx := ctxT(t, 10*time.Second)
	ts := fx.c.ClaimAhead(ctx, []string{"k"})
	var runs atomic.Int32
	st, err := runTicket(t, fx.c, ctx, ts[0], func(context.Context) error {
		runs.Add(1)
		hook.armed.Store(true)
		return nil
	})
	if err != nil || st != StatusExecuted {
		t.Fatalf("DoTicket = %v, %v", st, err)
	}
	if hook.left.Load() >= 0 {
		t.Fatalf("the injected failures were not hit (left %d)", hook.left.Load())
	}
	if v, _ := fx.rdb.Get(ctx, fx.prefix+"k").Result(); v != donePrefix {
		t.Fatalf("k = %q when marked(nil) was called, want done", v)
	}
	st, err = fx.c.DoStatus(ctx, "k", time.Hour, func(context.Context) error { runs.Add(1); return nil })
	if err != nil || st != StatusDuplicate || runs.Load() != 1 {
		t.Fatalf("second call: %v %v, runs %d", st, err, runs.Load())
	}
}

// Closing the client while a done mark is still to be sent reports the
// error to marked rather than dropping it.
func TestTicketMarkAfterCloseReportsError(t *testing.T) {
	requireSetGet(t)
	fx := newFixture(t, mode{batch: true}, nil)
	ctx := ctxT(t, 10*time.Second)
	ts := fx.c.ClaimAhead(ctx, []string{"k"})
	markc := make(chan error, 1)
	st, err := fx.c.DoTicket(ctx, ts[0], time.Hour, func(context.Context) error {
		_ = fx.c.Close()
		return nil
	}, Hooks{Marked: func(err error) { markc <- err }})
	if err != nil || st != StatusExecuted {
		t.Fatalf("DoTicket = %v, %v", st, err)
	}
	select {
	case merr := <-markc:
		if !errors.Is(merr, ErrClosed) {
			t.Fatalf("marked(%v), want ErrClosed", merr)
		}
	case <-ctx.Done():
		t.Fatal("marked never called")
	}
}

// With Hooks.Lost, f gets the caller's context as it is, and a claim lost
// while f runs (taken over by someone else) is reported through Lost, once,
// before DoTicket returns; a call whose claim stays is never told.
func TestTicketLostHook(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		const lease = 300 * time.Millisecond
		fx := newFixture(t, m, func(c *Config) { c.Lease = lease })
		ctx := ctxT(t, 10*time.Second)
		ts := fx.c.ClaimAhead(ctx, []string{"lost", "kept"})
		var lost atomic.Int32
		stop := make(chan struct{})
		st, err := fx.c.DoTicket(ctx, ts[0], time.Hour, func(fctx context.Context) error {
			if fctx != ctx {
				t.Error("f got a context of its own despite Hooks.Lost")
			}
			// Someone else takes the key over (as after an expiry).
			fx.rdb.Set(ctx, fx.prefix+"lost", processingPrefix+"other", time.Minute)
			select {
			case <-stop:
				return errors.New("stopped: claim lost")
			case <-time.After(3 * lease):
				return errors.New("never told that the claim was lost")
			}
		}, Hooks{Lost: func(err error) {
			if !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Lost(%v), want ErrLeaseLost", err)
			}
			if lost.Add(1) == 1 {
				close(stop)
			}
		}})
		if err == nil || err.Error() != "stopped: claim lost" || st != StatusExecuted {
			t.Fatalf("DoTicket = %v, %v", st, err)
		}
		if n := lost.Load(); n != 1 {
			t.Fatalf("Lost called %d times, want 1", n)
		}
		if v, _ := fx.rdb.Get(ctx, fx.prefix+"lost").Result(); v != processingPrefix+"other" {
			t.Fatalf("key = %q: the failed call touched the other owner's claim", v)
		}
		// A claim that stays ours through f's run, renewed past its lease,
		// is never reported lost.
		st, err = fx.c.DoTicket(ctx, ts[1], time.Hour, func(context.Context) error {
			time.Sleep(2 * lease)
			return nil
		}, Hooks{Lost: func(err error) { t.Errorf("Lost(%v) for a claim that was kept", err) }})
		if err != nil || st != StatusExecuted {
			t.Fatalf("kept: %v, %v", st, err)
		}
	})
}
