package once

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	c      *Client
	rdb    *redis.Client
	prefix string
}

// mode selects the code paths a fixture's client takes.
type mode struct {
	batch bool
	// scriptClaim claims with the Lua script, as on Redis < 7.0.
	scriptClaim bool
}

func (m mode) String() string { return fmt.Sprintf("batch=%v/script_claim=%v", m.batch, m.scriptClaim) }

func newFixture(t testing.TB, m mode, mutate func(*Config)) fixture {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	cfg := Config{Client: rdb, KeyPrefix: prefix, PollInterval: 5 * time.Millisecond}
	cfg.Batch.Enabled = m.batch
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := []Option{WithRegisterer(prometheus.NewRegistry())}
	if m.scriptClaim {
		opts = append(opts, func(o *options) { o.scriptClaim = true })
	}
	c, err := New(ctx, "test", cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return fixture{c: c, rdb: rdb, prefix: prefix}
}

// modes runs a test with and without batching, claiming with SET NX GET
// and with the Lua script: every path must keep the same semantics.
func modes(t *testing.T, fn func(t *testing.T, m mode)) {
	for _, m := range []mode{{}, {batch: true}, {scriptClaim: true}, {batch: true, scriptClaim: true}} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			if !m.scriptClaim {
				requireSetGet(t)
			}
			fn(t, m)
		})
	}
}

// requireSetGet skips a SET NX GET variant on a server without it (the
// Lua variant still runs there).
func requireSetGet(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ok, err := probeSetNXGet(ctxT(t, 5*time.Second), rdb, prefix)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if !ok {
		if testenv.InCI() {
			t.Fatal("Redis rejects SET NX GET (older than 7.0): CI runs Redis 7+ from scripts/redis.sh")
		}
		t.Skip("Redis rejects SET NX GET (older than 7.0)")
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestDoRunsOnceForSequentialDuplicates(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		var runs atomic.Int32
		f := func(context.Context) error { runs.Add(1); return nil }
		want := []Status{StatusExecuted, StatusDuplicate, StatusDuplicate}
		for i, w := range want {
			st, err := fx.c.DoStatus(ctx, "dedup:kf1:m1", time.Minute, f)
			if err != nil || st != w {
				t.Fatalf("call %d: status %v err %v, want %v nil", i, st, err, w)
			}
		}
		if err := fx.c.Do(ctx, "dedup:kf1:m1", time.Minute, f); err != nil {
			t.Fatalf("Do: %v", err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("f ran %d times, want 1", n)
		}
		// Another key is independent.
		if st, err := fx.c.DoStatus(ctx, "dedup:kf1:m2", time.Minute, f); err != nil || st != StatusExecuted {
			t.Fatalf("other key: %v %v", st, err)
		}
		if e, d := counterValue(t, fx.c.m.executed), counterValue(t, fx.c.m.duplicate); e != 2 || d != 3 {
			t.Fatalf("metrics executed=%v duplicate=%v, want 2 and 3", e, d)
		}
	})
}

func TestFailureReleasesKeyAndRetrySucceeds(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		boom := errors.New("boom")
		var runs atomic.Int32
		err := fx.c.Do(ctx, "k", time.Minute, func(context.Context) error { runs.Add(1); return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("Do err = %v, want boom", err)
		}
		if n, _ := fx.rdb.Exists(ctx, fx.prefix+"k").Result(); n != 0 {
			t.Fatalf("key still exists after failure")
		}
		st, err := fx.c.DoStatus(ctx, "k", time.Minute, func(context.Context) error { runs.Add(1); return nil })
		if err != nil || st != StatusExecuted {
			t.Fatalf("retry: %v %v", st, err)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("runs = %d, want 2", n)
		}
		v, _ := fx.rdb.Get(ctx, fx.prefix+"k").Result()
		if v != donePrefix {
			t.Fatalf("value = %q, want done marker", v)
		}
	})
}

func TestExecuteStoresResultForDuplicates(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		res, err := fx.c.Execute(ctx, "e", time.Minute, func(context.Context) ([]byte, error) { return []byte("first"), nil })
		if err != nil || string(res) != "first" {
			t.Fatalf("first: %q %v", res, err)
		}
		res, st, err := fx.c.ExecuteStatus(ctx, "e", time.Minute, func(context.Context) ([]byte, error) {
			t.Error("callback ran for a duplicate")
			return []byte("second"), nil
		})
		if err != nil || st != StatusDuplicate || string(res) != "first" {
			t.Fatalf("duplicate: %q %v %v", res, st, err)
		}
	})
}

func TestConcurrentExecuteRunsOnceAndSharesResult(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		var runs atomic.Int32
		started, release := make(chan struct{}), make(chan struct{})
		cb := func(context.Context) ([]byte, error) {
			if runs.Add(1) == 1 {
				close(started)
			}
			<-release
			return []byte("result-42"), nil
		}
		type out struct {
			res []byte
			st  Status
			err error
		}
		outs := make(chan out, 2)
		call := func() {
			res, st, err := fx.c.ExecuteStatus(ctx, "same", time.Minute, cb)
			outs <- out{res, st, err}
		}
		go call()
		<-started
		go call()
		// Release only once the second call found the claim and waits.
		for counterValue(t, fx.c.m.waits) < 1 {
			if ctx.Err() != nil {
				t.Fatal("second call never waited")
			}
			time.Sleep(time.Millisecond)
		}
		close(release)
		got := []out{<-outs, <-outs}
		if n := runs.Load(); n != 1 {
			t.Fatalf("callback ran %d times, want 1", n)
		}
		seen := map[Status]bool{}
		for _, o := range got {
			if o.err != nil || string(o.res) != "result-42" {
				t.Fatalf("call: %q %v", o.res, o.err)
			}
			seen[o.st] = true
		}
		if !seen[StatusExecuted] || !seen[StatusDuplicate] {
			t.Fatalf("statuses %v, want one executed and one duplicate", got)
		}
	})
}

func TestWaiterContextExpiresKeyStaysProcessing(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		started, release := make(chan struct{}), make(chan struct{})
		holderDone := make(chan error, 1)
		go func() {
			holderDone <- fx.c.Do(ctx, "w", time.Minute, func(context.Context) error {
				close(started)
				<-release
				return nil
			})
		}()
		<-started
		wctx, cancel := context.WithTimeout(ctx, 80*time.Millisecond)
		defer cancel()
		st, err := fx.c.DoStatus(wctx, "w", time.Minute, func(context.Context) error {
			t.Error("waiter ran f while the key was processing")
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) || st != StatusNone {
			t.Fatalf("waiter: %v %v, want deadline exceeded", st, err)
		}
		v, _ := fx.rdb.Get(ctx, fx.prefix+"w").Result()
		if !strings.HasPrefix(v, processingPrefix) {
			t.Fatalf("key = %q, want processing", v)
		}
		close(release)
		if err := <-holderDone; err != nil {
			t.Fatalf("holder: %v", err)
		}
	})
}

func TestCrashedClaimerBlocksOnlyForLease(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		const lease = 300 * time.Millisecond
		fx := newFixture(t, batch, func(c *Config) { c.Lease = lease })
		ctx := ctxT(t, 10*time.Second)
		// A claimer that crashed after claiming: its claim is in Redis and
		// nobody will finish or release it.
		crashed := fx.c.owner + "crashed"
		if v, err := claimScript.Run(ctx, fx.rdb, []string{fx.prefix + "c"}, crashed, lease.Milliseconds()).Int64(); err != nil || v != 1 {
			t.Fatalf("crash claim: %v %v", v, err)
		}
		start := time.Now()
		var runs atomic.Int32
		st, err := fx.c.DoStatus(ctx, "c", time.Minute, func(context.Context) error { runs.Add(1); return nil })
		elapsed := time.Since(start)
		if err != nil || st != StatusExecuted || runs.Load() != 1 {
			t.Fatalf("after lease: %v %v runs=%d", st, err, runs.Load())
		}
		if elapsed < lease-50*time.Millisecond {
			t.Fatalf("ran after %v: did not wait for the crashed claim's lease %v", elapsed, lease)
		}
	})
}

func TestDoneKeyHasTTL(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, nil)
		ctx := ctxT(t, 10*time.Second)
		const ttl = 72 * time.Hour
		if err := fx.c.Do(ctx, "ttl", ttl, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		got, err := fx.rdb.PTTL(ctx, fx.prefix+"ttl").Result()
		if err != nil || got <= ttl-5*time.Second || got > ttl {
			t.Fatalf("PTTL = %v (%v), want ≈ %v", got, err, ttl)
		}
	})
}

func TestLeaseExtendedWhileFRuns(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		// The lease leaves room for a loaded machine: the claim survives
		// any stall of the test process shorter than 5/12 of it (renewed after
		// a quarter, given up after two thirds without a renewal).
		const lease = 1200 * time.Millisecond
		fx := newFixture(t, batch, func(c *Config) { c.Lease = lease })
		ctx := ctxT(t, 10*time.Second)
		var runs atomic.Int32
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- fx.c.Do(ctx, "long", time.Minute, func(fctx context.Context) error {
				runs.Add(1)
				close(started)
				select {
				case <-time.After(4 * lease):
					return nil
				case <-fctx.Done():
					return context.Cause(fctx)
				}
			})
		}()
		<-started
		// Well past the lease, a second caller still sees the claim and must
		// not run.
		wctx, cancel := context.WithTimeout(ctx, 5*lease/2)
		defer cancel()
		_, err := fx.c.DoStatus(wctx, "long", time.Minute, func(context.Context) error { runs.Add(1); return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second caller: %v, want to still be waiting", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("long f: %v", err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("runs = %d, want 1", n)
		}
	})
}

func TestLeaseLostCancelsF(t *testing.T) {
	const lease = 60 * time.Millisecond
	fx := newFixture(t, mode{}, func(c *Config) { c.Lease = lease })
	ctx := ctxT(t, 10*time.Second)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- fx.c.Do(ctx, "lost", time.Minute, func(fctx context.Context) error {
			close(started)
			<-fctx.Done()
			return context.Cause(fctx)
		})
	}()
	<-started
	// Someone else takes the key over (as after an expiry).
	if err := fx.rdb.Set(ctx, fx.prefix+"lost", processingPrefix+"other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Do = %v, want ErrLeaseLost", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("f was not cancelled after its claim was taken")
	}
	// The failed call must not delete the other caller's claim.
	if v, _ := fx.rdb.Get(ctx, fx.prefix+"lost").Result(); v != processingPrefix+"other" {
		t.Fatalf("key = %q, want the other caller's claim", v)
	}
}

func TestFinishAfterLeaseExpiredStillRecordsDone(t *testing.T) {
	fx := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 10*time.Second)
	err := fx.c.Do(ctx, "gone", time.Minute, func(context.Context) error {
		// The claim vanishes (expired) before f returns.
		return fx.rdb.Del(ctx, fx.prefix+"gone").Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := fx.rdb.Get(ctx, fx.prefix+"gone").Result(); v != donePrefix {
		t.Fatalf("key = %q, want done: the effect happened", v)
	}
}

func TestPanicReleasesKey(t *testing.T) {
	fx := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 10*time.Second)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic was swallowed")
			}
		}()
		_ = fx.c.Do(ctx, "p", time.Minute, func(context.Context) error { panic("handler bug") })
	}()
	if n, _ := fx.rdb.Exists(ctx, fx.prefix+"p").Result(); n != 0 {
		t.Fatal("key kept after panic")
	}
}

func TestUnexpectedValueAndInvalidTTL(t *testing.T) {
	fx := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 10*time.Second)
	fx.rdb.Set(ctx, fx.prefix+"foreign", "1", time.Minute)
	f := func(context.Context) error { t.Error("f ran"); return nil }
	if err := fx.c.Do(ctx, "foreign", time.Minute, f); !errors.Is(err, ErrUnexpectedValue) {
		t.Fatalf("foreign value: %v", err)
	}
	if err := fx.c.Do(ctx, "x", 0, f); !errors.Is(err, ErrInvalidTTL) {
		t.Fatalf("ttl 0: %v", err)
	}
}

// TestBatchingManyGoroutines: 1000 goroutines over 100 keys; every key's f
// runs exactly once and every caller returns nil.
func TestBatchingManyGoroutines(t *testing.T) {
	modes(t, func(t *testing.T, batch mode) {
		fx := newFixture(t, batch, func(c *Config) { c.Batch.MaxBatch = 64; c.Batch.Pipelines = 2 })
		ctx := ctxT(t, 30*time.Second)
		const goroutines, keys = 1000, 100
		var runs [keys]atomic.Int32
		var dup atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Go(func() {
				k := g % keys
				st, err := fx.c.DoStatus(ctx, fmt.Sprintf("dedup:kf:%d", k), time.Minute, func(context.Context) error {
					runs[k].Add(1)
					time.Sleep(time.Millisecond) // keep the claim open so others wait
					return nil
				})
				if err != nil {
					errs <- err
				}
				if st == StatusDuplicate {
					dup.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Do: %v", err)
		}
		for k := range runs {
			if n := runs[k].Load(); n != 1 {
				t.Fatalf("key %d ran %d times", k, n)
			}
		}
		if d := dup.Load(); d != goroutines-keys {
			t.Fatalf("duplicates = %d, want %d", d, goroutines-keys)
		}
	})
}

func TestBatcherClosed(t *testing.T) {
	fx := newFixture(t, mode{batch: true}, nil)
	if err := fx.c.Close(); err != nil {
		t.Fatal(err)
	}
	err := fx.c.Do(context.Background(), "k", time.Minute, func(context.Context) error { return nil })
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestBatcherRecoversFromScriptFlush(t *testing.T) {
	fx := newFixture(t, mode{batch: true}, nil)
	ctx := ctxT(t, 10*time.Second)
	if err := fx.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	for range 2 {
		if err := fx.c.Do(ctx, "flush", time.Minute, func(context.Context) error { runs.Add(1); return nil }); err != nil {
			t.Fatalf("Do after SCRIPT FLUSH: %v", err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs = %d", runs.Load())
	}
}

func TestConfigValidate(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"ok", func(*Config) {}, ""},
		{"no redis", func(c *Config) { c.Client = nil }, "once.addr"},
		{"lease", func(c *Config) { c.Lease = time.Millisecond }, "once.lease 1ms is smaller than allowed 30ms"},
		{"poll", func(c *Config) { c.PollInterval = 2 * time.Minute }, "once.poll_interval"},
		{"flush", func(c *Config) { c.Batch.FlushInterval = time.Second }, "once.batch.flush_interval 1s is larger"},
		{"max batch", func(c *Config) { c.Batch.MaxBatch = -1 }, "once.batch.max_batch"},
		{"pipelines", func(c *Config) { c.Batch.Pipelines = 100 }, "once.batch.pipelines 100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Client: rdb}
			tt.mutate(&c)
			c.setDefaults()
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestFinishOutcomes covers what the done mark finds under the key when f
// returns: the key ends done unless another caller holds a live claim on
// it, which is never overwritten (outcome 4), and only a claim that is
// still ours counts as kept.
func TestFinishOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		found func(fx fixture) string // value under the key when f returns; "" = none
		want  int64
	}{
		{"own claim", nil, 1},
		{"claim expired", func(fixture) string { return "" }, 2},
		{"another caller's claim", func(fx fixture) string { return fx.c.owner + "other" }, 4},
		{"another caller's done", func(fixture) string { return donePrefix }, 3},
		{"an Execute result", func(fixture) string { return donePrefix + "result" }, 3},
	} {
		for _, m := range []mode{{}, {scriptClaim: true}} {
			t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
				if !m.scriptClaim {
					requireSetGet(t)
				}
				fx := newFixture(t, m, nil)
				ctx := ctxT(t, 10*time.Second)
				rkey := fx.prefix + "k"
				claim := fx.c.owner + "1"
				if _, claimed, err := fx.c.claim(ctx, rkey, claim); err != nil || !claimed {
					t.Fatalf("claim: %v %v", claimed, err)
				}
				if tc.found != nil {
					var err error
					if v := tc.found(fx); v == "" {
						err = fx.rdb.Del(ctx, rkey).Err()
					} else {
						err = fx.rdb.Set(ctx, rkey, v, time.Minute).Err()
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				n, err := fx.c.finish(ctx, rkey, claim, nil, time.Minute)
				if err != nil || n != tc.want {
					t.Fatalf("finish = %d, %v; want %d", n, err, tc.want)
				}
				want := donePrefix
				if v := ""; tc.found != nil {
					if v = tc.found(fx); v != "" {
						want = v // someone else's done marker or live claim stays
					}
				}
				if v, _ := fx.rdb.Get(ctx, rkey).Result(); v != want {
					t.Fatalf("key = %q, want %q", v, want)
				}
				if ttl := fx.rdb.PTTL(ctx, rkey).Val(); ttl <= 0 || ttl > time.Minute {
					t.Fatalf("done marker TTL %v", ttl)
				}
			})
		}
	}
}

// TestClaimFindsExistingValue: a claim on a key that is taken never
// overwrites it and hands back what is there, on both claim paths.
func TestClaimFindsExistingValue(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		ctx := ctxT(t, 10*time.Second)
		rkey := fx.prefix + "taken"
		other := fx.c.owner + "other"
		if err := fx.rdb.Set(ctx, rkey, other, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		cur, claimed, err := fx.c.claim(ctx, rkey, fx.c.owner+"me")
		if err != nil || claimed || cur != other {
			t.Fatalf("claim = %q %v %v; want the other claim back", cur, claimed, err)
		}
		if v := fx.rdb.Get(ctx, rkey).Val(); v != other {
			t.Fatalf("key = %q after a failed claim", v)
		}
		if ttl := fx.rdb.PTTL(ctx, rkey).Val(); ttl < 50*time.Second {
			t.Fatalf("TTL of the other claim changed to %v", ttl)
		}
	})
}

// TestProbeSetNXGet: New detects SET NX GET on Redis 7.0+ (so the plain
// claim is used) and leaves no probe key behind.
func TestProbeSetNXGet(t *testing.T) {
	fx := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 5*time.Second)
	info, err := fx.rdb.InfoMap(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	version := info["Server"]["redis_version"]
	var major int
	if _, err := fmt.Sscanf(version, "%d.", &major); err != nil {
		t.Fatalf("redis_version %q: %v", version, err)
	}
	if want := major >= 7; fx.c.setGet != want {
		t.Fatalf("Redis %s: setGet = %v, want %v", version, fx.c.setGet, want)
	}
	if keys := fx.rdb.Keys(ctx, fx.prefix+"once-probe:*").Val(); len(keys) != 0 {
		t.Fatalf("probe keys left: %v", keys)
	}
}

// failNext fails the next n commands (or pipelines) after it is armed.
type failNext struct {
	armed atomic.Bool
	left  atomic.Int32
}

func (h *failNext) fail() bool {
	return h.armed.Load() && h.left.Add(-1) >= 0
}

func (h *failNext) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failNext) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.fail() {
			err := errors.New("injected: connection reset")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failNext) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.fail() {
			err := errors.New("injected: connection reset")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// A done mark that fails after f ran is retried: f must not run again
// (the caller would otherwise retry the whole claim → f → done).
func TestDoneMarkRetriedAfterFailure(t *testing.T) {
	modes(t, func(t *testing.T, m mode) {
		fx := newFixture(t, m, nil)
		hook := &failNext{}
		hook.left.Store(2)
		fx.rdb.AddHook(hook)
		ctx := ctxT(t, 10*time.Second)
		var runs atomic.Int32
		st, err := fx.c.DoStatus(ctx, "k", time.Hour, func(context.Context) error {
			runs.Add(1)
			hook.armed.Store(true)
			return nil
		})
		if err != nil || st != StatusExecuted {
			t.Fatalf("DoStatus = %v, %v", st, err)
		}
		if hook.left.Load() >= 0 {
			t.Fatalf("the injected failures were not hit (left %d)", hook.left.Load())
		}
		st, err = fx.c.DoStatus(ctx, "k", time.Hour, func(context.Context) error { runs.Add(1); return nil })
		if err != nil || st != StatusDuplicate || runs.Load() != 1 {
			t.Fatalf("second call: %v %v, runs %d", st, err, runs.Load())
		}
	})
}
