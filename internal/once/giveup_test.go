package once

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// failScripts is a go-redis hook that fails every command running one of
// the given scripts while on is set, as a Redis that cannot be reached
// would, for that client only.
type failScripts struct {
	on     atomic.Bool
	hashes map[string]bool
	names  map[string]bool // commands failed by name (lower case)
}

var errInjected = errors.New("injected: connection reset")

func (f *failScripts) hit(cmd redis.Cmder) bool {
	args := cmd.Args()
	if !f.on.Load() || len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	h, _ := args[1].(string)
	return f.hashes[h] || f.names[strings.ToLower(name)]
}

func (f *failScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.hit(cmd) {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (f *failScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if f.hit(c) {
				for _, c := range cmds {
					c.SetErr(errInjected)
				}
				return errInjected
			}
		}
		return next(ctx, cmds)
	}
}

// hookedClient returns a Client on fx's Redis and key prefix whose
// commands pass through hook.
func hookedClient(t *testing.T, fx fixture, m mode, hook redis.Hook, mutate func(*Config)) *Client {
	t.Helper()
	rdb := redis.NewClient(fx.rdb.Options())
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	cfg := Config{Client: rdb, KeyPrefix: fx.prefix, PollInterval: 5 * time.Millisecond}
	cfg.Batch.Enabled = m.batch
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(ctxT(t, 5*time.Second), "test-a", cfg, WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestUnrenewableClaimGivenUpBeforeAnotherOwnerRuns: owner A runs f and
// can no longer renew its claim (every renewal fails, as when A cannot
// reach Redis); B waits on the key. A must stop f before the claim can
// expire and B can run f: the two effects never overlap. Runs with the
// shipped lease. Before the keeper gave up unrenewable claims, A's f ran
// on, uncancelled, while B ran the same key.
func TestUnrenewableClaimGivenUpBeforeAnotherOwnerRuns(t *testing.T) {
	for _, m := range []mode{{}, {batch: true}} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			requireSetGet(t)
			fx := newFixture(t, m, nil) // B, shipped lease
			hook := &failScripts{hashes: map[string]bool{extendScript.Hash(): true}}
			a := hookedClient(t, fx, m, hook, nil)
			lease := a.lease
			ctx := ctxT(t, 6*lease)

			var aRunning, overlap atomic.Bool
			var aStopped, bStarted atomic.Int64
			started := make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				aDone <- a.Do(ctx, "k", time.Minute, func(fctx context.Context) error {
					aRunning.Store(true)
					hook.on.Store(true) // from now on A cannot renew
					close(started)
					defer func() { aStopped.Store(time.Now().UnixNano()); aRunning.Store(false) }()
					select {
					case <-fctx.Done():
						return context.Cause(fctx)
					case <-time.After(3 * lease):
						return nil // never told: it ran on past B's start
					}
				})
			}()
			<-started
			var bRuns atomic.Int32
			err := fx.c.Do(ctx, "k", time.Minute, func(context.Context) error {
				bRuns.Add(1)
				bStarted.Store(time.Now().UnixNano())
				overlap.Store(aRunning.Load())
				return nil
			})
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			aErr := <-aDone
			if overlap.Load() {
				t.Fatal("B ran f while A, which could not renew its claim, was still running f")
			}
			if !errors.Is(aErr, ErrLeaseLost) {
				t.Fatalf("A = %v, want ErrLeaseLost (given up)", aErr)
			}
			if bRuns.Load() != 1 {
				t.Fatalf("B ran %d times", bRuns.Load())
			}
			if gap := time.Duration(bStarted.Load() - aStopped.Load()); gap <= 0 {
				t.Fatalf("A stopped %v after B started", -gap)
			}
		})
	}
}

// TestDoneMarkLeavesAnotherOwnersClaim: when A's claim was taken over
// while its f ran (it expired and B claimed the key), A's done mark must not
// overwrite B's claim — that would cancel B midway and hide the double
// run — and the conflict is counted. Before, Do's mark was an
// unconditional SET … GET.
func TestDoneMarkLeavesAnotherOwnersClaim(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		ctx := ctxT(t, 10*time.Second)
		other := processingPrefix + "someone-else:1"
		err := fx.c.Do(ctx, "taken", time.Minute, func(context.Context) error {
			return fx.rdb.Set(ctx, fx.prefix+"taken", other, time.Minute).Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		if v := fx.rdb.Get(ctx, fx.prefix+"taken").Val(); v != other {
			t.Fatalf("key = %q, want the other owner's claim left alone", v)
		}
		if n := counterValue(t, fx.c.m.markConflict); n != 1 {
			t.Fatalf("mark conflicts = %v, want 1", n)
		}
	})
}

// TestClaimRenewedUntilDoneMarkWritten: f succeeded but its done mark
// cannot be written for longer than the lease; the claim must stay ours
// meanwhile (nobody else may claim the key and run f again), and the mark
// lands on our own claim once Redis takes it. Before, renewal stopped when
// f returned.
func TestClaimRenewedUntilDoneMarkWritten(t *testing.T) {
	for _, m := range []mode{{}, {batch: true}} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			requireSetGet(t)
			const lease = 1200 * time.Millisecond
			fx := newFixture(t, m, func(c *Config) { c.Lease = lease })
			hook := &failScripts{hashes: map[string]bool{finishScript.Hash(): true}}
			a := hookedClient(t, fx, m, hook, func(c *Config) { c.Lease = lease })
			ctx := ctxT(t, 20*time.Second)
			done := make(chan error, 1)
			go func() {
				done <- a.Do(ctx, "slowmark", time.Minute, func(context.Context) error {
					hook.on.Store(true)
					return nil
				})
			}()
			// Past twice the lease, someone else still finds our claim.
			time.Sleep(2 * lease)
			ran := false
			wctx, cancel := context.WithTimeout(ctx, lease/2)
			_, err := fx.c.DoStatus(wctx, "slowmark", time.Minute, func(context.Context) error { ran = true; return nil })
			cancel()
			if ran || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("another caller ran=%v err=%v while the done mark was pending; want it still waiting", ran, err)
			}
			hook.on.Store(false)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if v := fx.rdb.Get(ctx, fx.prefix+"slowmark").Val(); v != donePrefix {
				t.Fatalf("key = %q, want done", v)
			}
			if n := counterValue(t, a.m.leaseLost); n != 0 {
				t.Fatalf("lease lost %v times; the claim should have been kept", n)
			}
		})
	}
}

// TestWaitingReportsForeignClaims: a call waiting on another owner's claim
// (a crashed consumer's, until the lease expires) is visible in Waiting
// and the gauges, and disappears from them when the wait ends.
func TestWaitingReportsForeignClaims(t *testing.T) {
	fx := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 10*time.Second)
	if err := fx.rdb.Set(ctx, fx.prefix+"held", processingPrefix+"dead-owner:1", 400*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fx.c.Do(ctx, "held", time.Minute, func(context.Context) error { return nil }) }()
	time.Sleep(200 * time.Millisecond)
	w := fx.c.Waiting()
	if w.Count != 1 || w.Oldest < 100*time.Millisecond || w.OldestKey != "held" {
		t.Fatalf("Waiting = %+v while a call waits on a foreign claim", w)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w := fx.c.Waiting(); w.Count != 0 || w.Oldest != 0 {
		t.Fatalf("Waiting = %+v after the wait ended", w)
	}
}
