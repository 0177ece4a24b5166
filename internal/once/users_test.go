package once

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

type usersFixture struct {
	rdb    *redis.Client
	prefix string
}

func newUsersFixture(t *testing.T) usersFixture {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return usersFixture{rdb: rdb, prefix: prefix}
}

// process returns a Users store as one consumer process would have it.
func (fx usersFixture) process(t *testing.T, mutate func(*UsersConfig)) *Users {
	t.Helper()
	cfg := UsersConfig{Client: fx.rdb, KeyPrefix: fx.prefix, PollInterval: 5 * time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}
	u, err := NewUsers(ctxT(t, 5*time.Second), "test", cfg, WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatalf("NewUsers: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = u.Close(ctx)
	})
	return u
}

func items(sendTime int64, keys ...string) []UserItem {
	out := make([]UserItem, len(keys))
	for i, k := range keys {
		out[i] = UserItem{Key: k, SendTime: sendTime}
	}
	return out
}

// run runs every ticket with f and waits for their marks; it returns the
// statuses.
func runAll(t *testing.T, u *Users, ts []*UserTicket, f func(context.Context) error) []Status {
	t.Helper()
	out := make([]Status, len(ts))
	marks := make(chan error, len(ts))
	for i, tk := range ts {
		st, err := u.DoTicket(ctxT(t, 10*time.Second), tk, f, func(err error) { marks <- err }, func(error) {})
		if err != nil {
			t.Fatalf("DoTicket %s: %v", tk.Key(), err)
		}
		out[i] = st
		if st != StatusExecuted {
			marks <- nil
		}
	}
	for range ts {
		select {
		case err := <-marks:
			if err != nil {
				t.Fatalf("mark: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("done marks not written in 10s")
		}
	}
	return out
}

func TestUsersRunEachMessageOnceAcrossOwners(t *testing.T) {
	fx := newUsersFixture(t)
	now := time.Now().Unix()
	var runs atomic.Int32
	f := func(context.Context) error { runs.Add(1); return nil }

	a := fx.process(t, nil)
	st := runAll(t, a, a.ClaimUser(ctxT(t, 5*time.Second), "u1", items(now, "k:1", "k:2", "k:3")), f)
	for i, s := range st {
		if s != StatusExecuted {
			t.Fatalf("first owner, message %d: %v, want executed", i, s)
		}
	}
	// The same owner again (its lease and memory): all duplicates.
	st = runAll(t, a, a.ClaimUser(ctxT(t, 5*time.Second), "u1", items(now, "k:1", "k:3", "k:4")), f)
	if st[0] != StatusDuplicate || st[1] != StatusDuplicate || st[2] != StatusExecuted {
		t.Fatalf("same owner: %v, want duplicate duplicate executed", st)
	}
	if err := a.Close(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Another process (the partition's next owner) reads the marks.
	b := fx.process(t, nil)
	st = runAll(t, b, b.ClaimUser(ctxT(t, 5*time.Second), "u1", items(now, "k:1", "k:2", "k:3", "k:4", "k:5")), f)
	want := []Status{StatusDuplicate, StatusDuplicate, StatusDuplicate, StatusDuplicate, StatusExecuted}
	for i := range want {
		if st[i] != want[i] {
			t.Fatalf("next owner: %v, want %v", st, want)
		}
	}
	if n := runs.Load(); n != 5 {
		t.Fatalf("handler ran %d times, want 5 (one per message)", n)
	}
	// A failed handler leaves nothing: a retry runs it.
	ts := b.ClaimUser(ctxT(t, 5*time.Second), "u1", items(now, "k:6"))
	if _, err := b.DoTicket(ctxT(t, 5*time.Second), ts[0], func(context.Context) error { return errors.New("boom") }, nil, nil); err == nil {
		t.Fatal("want the handler's error")
	}
	if st := runAll(t, b, b.ClaimUser(ctxT(t, 5*time.Second), "u1", items(now, "k:6")), f); st[0] != StatusExecuted {
		t.Fatalf("retry after failure: %v, want executed", st[0])
	}
}

// The per-message cost the design is for: a day's marks of a user are one
// intset, 8 bytes a message.
func TestUsersMarksAreAnIntset(t *testing.T) {
	fx := newUsersFixture(t)
	u := fx.process(t, nil)
	now := time.Now().Unix()
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = "wkAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:" + strconv.Itoa(i) + "-0123456789abcdef0123456789abcdef"
	}
	runAll(t, u, u.ClaimUser(ctxT(t, 5*time.Second), "wmUSER", items(now, keys...)), func(context.Context) error { return nil })
	ctx := ctxT(t, 5*time.Second)
	key := u.doneKey("wmUSER", dayOf(now))
	enc, err := fx.rdb.ObjectEncoding(ctx, key).Result()
	if err != nil || enc != "intset" {
		t.Fatalf("encoding of %s: %q %v, want intset", key, enc, err)
	}
	n, err := fx.rdb.SCard(ctx, key).Result()
	if err != nil || n != 200 {
		t.Fatalf("SCARD: %d %v", n, err)
	}
	mem, err := fx.rdb.MemoryUsage(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(mem) / 200; per > 10 {
		t.Fatalf("%.1f bytes per mark, want <= 10 (an intset of 8-byte members)", per)
	}
	ttl, err := fx.rdb.PTTL(ctx, key).Result()
	if err != nil || ttl < 4*24*time.Hour {
		t.Fatalf("TTL %v %v, want >= the 4-day dedup TTL", ttl, err)
	}
}

// (c) A re-pulled copy of a message processed three days ago — WeChat's
// re-pull window — has the same send time and is found in the same set.
func TestUsersRecognisesACopyFromThreeDaysAgo(t *testing.T) {
	fx := newUsersFixture(t)
	sent := time.Now().Add(-3*24*time.Hour - time.Hour).Unix()
	a := fx.process(t, nil)
	var runs atomic.Int32
	f := func(context.Context) error { runs.Add(1); return nil }
	runAll(t, a, a.ClaimUser(ctxT(t, 5*time.Second), "u", items(sent, "okf:old")), f)
	_ = a.Close(ctxT(t, 5*time.Second))
	// The set lives one TTL after its last write, not after the send time.
	ttl, err := fx.rdb.PTTL(ctxT(t, 5*time.Second), a.doneKey("u", dayOf(sent))).Result()
	if err != nil || ttl < 4*24*time.Hour {
		t.Fatalf("TTL %v %v, want >= 4 days from the write", ttl, err)
	}
	b := fx.process(t, nil)
	st := runAll(t, b, b.ClaimUser(ctxT(t, 5*time.Second), "u", items(sent, "okf:old")), f)
	if st[0] != StatusDuplicate || runs.Load() != 1 {
		t.Fatalf("copy: %v, runs %d; want duplicate, 1", st[0], runs.Load())
	}
}

// A user leased by another owner is waited on, never treated as done; its
// marks are seen once the owner is done with it.
func TestUsersWaitForAnotherOwner(t *testing.T) {
	fx := newUsersFixture(t)
	now := time.Now().Unix()
	a, b := fx.process(t, nil), fx.process(t, nil)
	release := make(chan struct{})
	started := make(chan struct{})
	ta := a.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	go func() {
		_, _ = a.DoTicket(context.Background(), ta[0], func(context.Context) error {
			close(started)
			<-release
			return nil
		}, nil, nil)
	}()
	<-started
	tb := b.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	res := make(chan Status, 1)
	var ranB atomic.Bool
	go func() {
		st, err := b.DoTicket(ctxT(t, 20*time.Second), tb[0], func(context.Context) error { ranB.Store(true); return nil }, nil, nil)
		if err != nil {
			t.Errorf("b: %v", err)
		}
		res <- st
	}()
	select {
	case st := <-res:
		t.Fatalf("b finished (%v) while a held the user", st)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	// a's mark lands, then a gives the lease back (a rebalance).
	waitFor(t, 5*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return len(a.marks) == 0 && a.flushing == 0 })
	a.ReleaseIdle()
	select {
	case st := <-res:
		if st != StatusDuplicate || ranB.Load() {
			t.Fatalf("b: %v (ran %v), want duplicate", st, ranB.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b still waiting 10s after a released the user")
	}
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// takeOver makes another owner take user's lease from under a (as after a
// pause of a longer than the lease): the key is deleted, b acquires it.
func takeOver(t *testing.T, fx usersFixture, a, b *Users, user string, now int64) *UserTicket {
	t.Helper()
	if err := fx.rdb.Del(ctxT(t, 5*time.Second), a.leaseKey(user)).Err(); err != nil {
		t.Fatal(err)
	}
	tb := b.ClaimUser(ctxT(t, 5*time.Second), user, items(now, "k:other"))
	if tb[0].err != nil {
		t.Fatalf("b could not take the lease: %v", tb[0].err)
	}
	return tb[0]
}

// (a) A lease lost mid-mailbox stops the old owner before its next effect:
// the running handler is told, and the next message of the window waits
// for the new owner instead of running. With the shipped 10 s lease.
func TestUsersLeaseLostStopsTheOwnerBeforeItsNextEffect(t *testing.T) {
	fx := newUsersFixture(t)
	now := time.Now().Unix()
	a, b := fx.process(t, func(c *UsersConfig) { c.Lease = 0 }), fx.process(t, nil)
	if a.lease != 10*time.Second {
		t.Fatalf("shipped lease %v, want 10s", a.lease)
	}
	ts := a.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1", "k:2"))
	lost := make(chan error, 1)
	var tb *UserTicket
	st, err := a.DoTicket(ctxT(t, 30*time.Second), ts[0], func(ctx context.Context) error {
		tb = takeOver(t, fx, a, b, "u", now)
		select {
		case <-ctx.Done():
		case err := <-lost:
			return err
		case <-time.After(20 * time.Second):
			return errors.New("never told")
		}
		return ctx.Err()
	}, nil, func(err error) { lost <- err })
	if err == nil || st != StatusExecuted {
		t.Fatalf("first message: %v %v, want the handler stopped by the lost lease", st, err)
	}
	// The next message of a's window must not run while b holds the user.
	var ranA atomic.Bool
	res := make(chan error, 1)
	go func() {
		_, err := a.DoTicket(ctxT(t, 30*time.Second), ts[1], func(context.Context) error { ranA.Store(true); return nil }, nil, nil)
		res <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if ranA.Load() {
		t.Fatal("a ran its next message while b held the user's lease")
	}
	runAll(t, b, []*UserTicket{tb}, func(context.Context) error { return nil })
	b.ReleaseIdle()
	if err := <-res; err != nil {
		t.Fatalf("a after b released: %v", err)
	}
	if !ranA.Load() {
		t.Fatal("a did not run its message after b released the user")
	}
}

// (b) A done mark from an owner fenced out — another owner took the lease
// while its handler ran, and its renewal found that out — is refused by
// Redis.
func TestUsersMarkFromAFencedOutOwnerIsRefused(t *testing.T) {
	fx := newUsersFixture(t)
	now := time.Now().Unix()
	a, b := fx.process(t, func(c *UsersConfig) { c.Lease = time.Second }), fx.process(t, nil)
	ts := a.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	marked := make(chan error, 1)
	lost := make(chan error, 1)
	var tokA int64
	_, err := a.DoTicket(ctxT(t, 5*time.Second), ts[0], func(ctx context.Context) error {
		tokA, _ = FencingTokenFrom(ctx)
		takeOver(t, fx, a, b, "u", now)
		select {
		case <-lost:
		case <-time.After(3 * time.Second):
			t.Error("a was not told it lost the lease")
		}
		return nil // the effect happened anyway (a handler that ignored the signal)
	}, func(err error) { marked <- err }, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-marked:
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("mark: %v, want ErrFenced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("mark not settled")
	}
	ok, err := fx.rdb.SIsMember(ctxT(t, 5*time.Second), a.doneKey("u", dayOf(now)), Digest("k:1")).Result()
	if err != nil || ok {
		t.Fatalf("refused mark is in the set: %v %v", ok, err)
	}
	// b's token is larger: a downstream fencing on it refuses a.
	tb := b.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:2"))
	var tokB int64
	runAll(t, b, tb, func(ctx context.Context) error { tokB, _ = FencingTokenFrom(ctx); return nil })
	if tokA <= 0 || tokB <= tokA {
		t.Fatalf("fencing tokens a=%d b=%d, want 0 < a < b", tokA, tokB)
	}
}

// Migration: the per-message keys of the previous store are read (done
// markers, claims waited on) and, in read_write, written beside the marks.
func TestUsersReadTheLegacyKeys(t *testing.T) {
	fx := newUsersFixture(t)
	now := time.Now().Unix()
	ctx := ctxT(t, 5*time.Second)
	fx.rdb.Set(ctx, fx.prefix+"k:done", "d:", time.Hour)
	fx.rdb.Set(ctx, fx.prefix+"k:claimed", "p:old-consumer:1", time.Hour)
	u := fx.process(t, func(c *UsersConfig) { c.Legacy = LegacyReadWrite })
	ts := u.ClaimUser(ctx, "u", items(now, "k:done", "k:claimed", "k:new"))
	var ran []string
	f := func(k string) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, k); return nil }
	}
	if st, err := u.DoTicket(ctx, ts[0], f("k:done"), nil, nil); err != nil || st != StatusDuplicate {
		t.Fatalf("legacy done: %v %v", st, err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		fx.rdb.Set(context.Background(), fx.prefix+"k:claimed", "d:", time.Hour) // the old consumer finished it
	}()
	start := time.Now()
	if st, err := u.DoTicket(ctxT(t, 5*time.Second), ts[1], f("k:claimed"), nil, nil); err != nil || st != StatusDuplicate {
		t.Fatalf("legacy claim: %v %v, want a wait and then duplicate", st, err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Fatal("did not wait for the legacy claim")
	}
	runAll(t, u, ts[2:], f("k:new"))
	if len(ran) != 1 || ran[0] != "k:new" {
		t.Fatalf("ran %v, want only k:new", ran)
	}
	if v, err := fx.rdb.Get(ctx, fx.prefix+"k:new").Result(); err != nil || v != "d:" {
		t.Fatalf("read_write legacy marker: %q %v", v, err)
	}
}

// A ticket whose handler failed is run again by the next DoTicket (the
// consumer retries a handler stopped by a lost lease with the same ticket),
// and leaves the lease free to be given back afterwards.
func TestUsersTicketRunAgainAfterItsHandlerFailed(t *testing.T) {
	fx := newUsersFixture(t)
	u := fx.process(t, nil)
	ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(time.Now().Unix(), "k:1"))
	if _, err := u.DoTicket(ctxT(t, 5*time.Second), ts[0], func(context.Context) error { return errors.New("stopped") }, nil, nil); err == nil {
		t.Fatal("want f's error")
	}
	if st := runAll(t, u, ts, func(context.Context) error { return nil }); st[0] != StatusExecuted {
		t.Fatalf("second run: %v, want executed", st[0])
	}
	u.ReleaseIdle()
	if n, err := fx.rdb.Exists(ctxT(t, 5*time.Second), u.leaseKey("u")).Result(); err != nil || n != 0 {
		t.Fatalf("lease still in Redis after ReleaseIdle (%d, %v): a ticket kept its share", n, err)
	}
}

// A release on its way to Redis is never overtaken by the same process
// taking the lease again under the same value, which the release would
// then delete from under the new holder.
func TestUsersReleaseDoesNotDeleteALeaseTakenAgain(t *testing.T) {
	fx := newUsersFixture(t)
	u := fx.process(t, nil)
	now := time.Now().Unix()
	for i := range 200 {
		done := make(chan struct{})
		go func() { u.ReleaseIdle(); close(done) }()
		ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:"+strconv.Itoa(i)))
		var held bool
		runAll(t, u, ts, func(ctx context.Context) error {
			v, err := fx.rdb.Get(ctx, u.leaseKey("u")).Result()
			held = err == nil && strings.HasSuffix(v, ":"+u.owner)
			return nil
		})
		<-done
		if !held {
			t.Fatalf("round %d: the handler ran while the user's lease was not in Redis", i)
		}
	}
}

// A message handled while its mark cannot be written, then a copy of it
// after the lease was lost and taken again (the sets read afresh, without
// the mark): the copy is a duplicate — the process's marks on their way
// count as done (redis-full with leases ran such copies 212 times).
func TestUsersPendingMarksSurviveALostLease(t *testing.T) {
	fx := newUsersFixture(t)
	hook := &failScripts{names: map[string]bool{"sadd": true}} // Redis refuses the marks (out of memory, or cut off)
	rdb := redis.NewClient(fx.rdb.Options())
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	u := usersFixture{rdb: rdb, prefix: fx.prefix}.process(t, nil)
	now := time.Now().Unix()
	var runs atomic.Int32
	f := func(context.Context) error { runs.Add(1); return nil }
	hook.on.Store(true)
	ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	if st, err := u.DoTicket(ctxT(t, 5*time.Second), ts[0], f, nil, nil); err != nil || st != StatusExecuted {
		t.Fatalf("first: %v %v", st, err)
	}
	// The lease is lost (as after failed renewals) and taken again.
	u.mu.Lock()
	told := u.loseLocked(u.leases["u"])
	u.mu.Unlock()
	for _, f := range told {
		f(errLeaseLost)
	}
	ts = u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	st, err := u.DoTicket(ctxT(t, 5*time.Second), ts[0], f, nil, nil)
	if err != nil || st != StatusDuplicate || runs.Load() != 1 {
		t.Fatalf("copy after the lease was taken again: %v %v, runs %d; want duplicate, 1", st, err, runs.Load())
	}
	hook.on.Store(false) // the mark lands
	waitFor(t, 10*time.Second, func() bool {
		ok, _ := fx.rdb.SIsMember(context.Background(), u.doneKey("u", dayOf(now)), Digest("k:1")).Result()
		return ok
	})
}

// holdReads holds the answer of a pipeline that reads a done set (SMEMBERS)
// once on is set: it calls opened (the read has been answered), then waits
// until until reports true (3 s at most) and records in landed whether it
// did.
type holdReads struct {
	on     atomic.Bool
	opened func()
	until  func() bool
	landed atomic.Bool
	held   atomic.Bool
}

func (h *holdReads) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && h.on.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "smembers" }) {
			h.on.Store(false)
			h.held.Store(true)
			h.opened()
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !h.until(); {
				time.Sleep(time.Millisecond)
			}
			h.landed.Store(h.until())
		}
		return err
	}
}

// A pending mark that lands while the user's set is being read (the read's
// answer predates it, and it is no longer pending when the answer is used)
// still makes its message's copy a duplicate.
func TestUsersMarkLandingDuringTheReadIsKnown(t *testing.T) {
	fx := newUsersFixture(t)
	// The mark fails, plain or fenced, until the read has been answered:
	// so it lands in a pipeline of its own after the read, never in the
	// read's (whose answer the hold keeps back).
	fail := &failScripts{names: map[string]bool{"sadd": true}, hashes: map[string]bool{markScript.Hash(): true}}
	hold := &holdReads{opened: func() { fail.on.Store(false) }}
	rdb := redis.NewClient(fx.rdb.Options())
	rdb.AddHook(fail)
	rdb.AddHook(hold)
	t.Cleanup(func() { _ = rdb.Close() })
	u := usersFixture{rdb: rdb, prefix: fx.prefix}.process(t, nil)
	now := time.Now().Unix()
	hold.until = func() bool {
		ok, _ := fx.rdb.SIsMember(context.Background(), u.doneKey("u", dayOf(now)), Digest("k:1")).Result()
		u.mu.Lock()
		defer u.mu.Unlock()
		return ok && len(u.leases["u"].pending) == 0
	}
	var runs atomic.Int32
	f := func(context.Context) error { runs.Add(1); return nil }
	fail.on.Store(true)
	ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	if st, err := u.DoTicket(ctxT(t, 5*time.Second), ts[0], f, nil, nil); err != nil || st != StatusExecuted {
		t.Fatalf("first: %v %v", st, err)
	}
	u.mu.Lock()
	u.loseLocked(u.leases["u"])
	u.mu.Unlock()
	hold.on.Store(true)
	// The claim's read is the one held; should it have gone out with a
	// failing mark, DoTicket reads again.
	ts = u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1"))
	st, err := u.DoTicket(ctxT(t, 5*time.Second), ts[0], f, nil, nil)
	if !hold.held.Load() || !hold.landed.Load() {
		t.Fatalf("read held: %v; the mark landed while it was: %v", hold.held.Load(), hold.landed.Load())
	}
	if err != nil || st != StatusDuplicate || runs.Load() != 1 {
		t.Fatalf("copy: %v %v, runs %d; want duplicate, 1", st, err, runs.Load())
	}
}

// A re-pulled copy claimed in the same window as its original (both were
// not done when claimed) is a duplicate when its turn comes.
func TestUsersCopyInTheSameWindowIsADuplicate(t *testing.T) {
	fx := newUsersFixture(t)
	u := fx.process(t, nil)
	var runs atomic.Int32
	st := runAll(t, u, u.ClaimUser(ctxT(t, 5*time.Second), "u", items(time.Now().Unix(), "k:1", "k:2", "k:1")),
		func(context.Context) error { runs.Add(1); return nil })
	if st[2] != StatusDuplicate || runs.Load() != 2 {
		t.Fatalf("statuses %v, runs %d; want the copy a duplicate and 2 runs", st, runs.Load())
	}
}

// Digest is FNV-1a of the key: marks written by earlier versions (which
// used hash/fnv) are found by this one. It allocates nothing.
func TestDigestIsFNV1a(t *testing.T) {
	for _, k := range []string{"", "k:1", "wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw:" + strings.Repeat("m", 36), "微信客服:消息"} {
		h := fnv.New64a()
		_, _ = h.Write([]byte(k))
		if got, want := Digest(k), int64(h.Sum64()); got != want {
			t.Errorf("Digest(%q) = %d, want %d", k, got, want)
		}
	}
	key := "wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw:" + strings.Repeat("m", 36)
	if n := testing.AllocsPerRun(100, func() { Digest(key) }); n != 0 {
		t.Errorf("Digest allocates %v times", n)
	}
}

// A lease left idle (not renewed) for most of the time keep trusts it is
// taken again before new work starts under it: a handler started on it
// would otherwise be stopped by keep at two thirds of a lease, before the
// first renewal could land — after its effect, perhaps, and then run again.
// With the shipped 10s lease.
func TestUsersIdleLeaseIsContinuedBeforeWorkStarts(t *testing.T) {
	fx := newUsersFixture(t)
	u := fx.process(t, func(c *UsersConfig) { c.Lease = 0 })
	now := time.Now().Unix()
	runAll(t, u, u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:1")), func(context.Context) error { return nil })
	// Idle since its last renewal 6.4s ago: still held by this process's
	// clock (under 6.67s), about to be given up.
	u.mu.Lock()
	u.leases["u"].lastOK = time.Now().Add(-6400 * time.Millisecond)
	u.mu.Unlock()
	ts := u.ClaimUser(ctxT(t, 5*time.Second), "u", items(now, "k:2"))
	lost := make(chan error, 1)
	st, err := u.DoTicket(ctxT(t, 10*time.Second), ts[0], func(ctx context.Context) error {
		select { // longer than two keep ticks (a twelfth of the lease each)
		case err := <-lost:
			return err
		case <-time.After(2 * time.Second):
			return nil
		}
	}, nil, func(err error) { lost <- err })
	if err != nil || st != StatusExecuted {
		t.Fatalf("handler on a lease idle for 6.4s: %v %v; want it to run to the end", st, err)
	}
}

// countCmds counts the commands a client sends, by name, pipelines
// included.
type countCmds struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countCmds) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	for _, cmd := range cmds {
		c.n[cmd.Name()]++
	}
}

func (c *countCmds) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *countCmds) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countCmds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(cmd); return next(ctx, cmd) }
}
func (c *countCmds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(cmds...); return next(ctx, cmds) }
}

// oneMessageDone is a process (its commands counted) that has run user
// u's message k:1: it holds u's lease and knows today's set.
type oneMessageDone struct {
	fx    usersFixture
	u     *Users
	count *countCmds
	now   int64
	runs  atomic.Int32
}

func newOneMessageDone(t *testing.T) *oneMessageDone {
	t.Helper()
	o := &oneMessageDone{fx: newUsersFixture(t), now: time.Now().Unix()}
	o.count = &countCmds{}
	rdb := redis.NewClient(o.fx.rdb.Options())
	rdb.AddHook(o.count)
	t.Cleanup(func() { _ = rdb.Close() })
	o.u = usersFixture{rdb: rdb, prefix: o.fx.prefix}.process(t, nil)
	o.run(t, items(o.now, "k:1"))
	if got := o.count.get("smembers"); got != 1 {
		t.Fatalf("smembers after the first claim: %d, want 1", got)
	}
	return o
}

// run claims and runs items as user u; it returns their statuses.
func (o *oneMessageDone) run(t *testing.T, its []UserItem) []Status {
	t.Helper()
	return runAll(t, o.u, o.u.ClaimUser(ctxT(t, 5*time.Second), "u", its), func(context.Context) error { o.runs.Add(1); return nil })
}

// setAge makes u's lease look taken or renewed d ago.
func (o *oneMessageDone) setAge(d time.Duration) {
	o.u.mu.Lock()
	o.u.leases["u"].lastOK = time.Now().Add(-d)
	o.u.mu.Unlock()
}

// lease returns u's lease entry (nil when forgotten) and its age.
func (o *oneMessageDone) lease() (*userLease, time.Duration) {
	o.u.mu.Lock()
	defer o.u.mu.Unlock()
	l := o.u.leases["u"]
	if l == nil {
		return nil, 0
	}
	return l, time.Since(l.lastOK)
}

// wantRun checks the statuses of the second run and the handler's runs.
func (o *oneMessageDone) wantRun(t *testing.T, st []Status, want ...Status) {
	t.Helper()
	if !slices.Equal(st, want) || o.runs.Load() != 2 {
		t.Fatalf("statuses %v, runs %d; want %v, 2", st, o.runs.Load(), want)
	}
}

// A lease this process still holds, but too old to start work under, is
// continued without reading again the days it knows: nobody else can have
// written them meanwhile.
func TestUsersHeldLeaseIsContinuedWithoutReadingItsDaysAgain(t *testing.T) {
	o := newOneMessageDone(t)
	o.setAge(5 * time.Second) // held (< 6.67s), not startable (> 4.17s)
	evals := o.count.get("evalsha")
	o.wantRun(t, o.run(t, items(o.now, "k:1", "k:2")), StatusDuplicate, StatusExecuted)
	if got := o.count.get("smembers"); got != 1 {
		t.Errorf("smembers after continuing the lease: %d, want still 1 (the day is known)", got)
	}
	if got := o.count.get("evalsha") - evals; got < 1 {
		t.Errorf("lease scripts sent to continue it: %d, want ≥ 1", got)
	}
	if _, age := o.lease(); age > time.Second {
		t.Errorf("lease age after it was continued: %v", age)
	}
}

// When a lease believed held comes back new (Redis lost it), what was known
// of its days is dropped and every day the tickets need is read again.
func TestUsersHeldLeaseFoundNewReadsItsDaysAgain(t *testing.T) {
	o := newOneMessageDone(t)
	if err := o.fx.rdb.Del(context.Background(), o.u.leaseKey("u")).Err(); err != nil {
		t.Fatal(err)
	}
	o.setAge(5 * time.Second)
	// k:0 is of the day before: a day not known, read with the continue.
	o.wantRun(t, o.run(t, append(items(o.now-86400, "k:0"), items(o.now, "k:1")...)), StatusExecuted, StatusDuplicate)
	if got := o.count.get("smembers"); got != 3 {
		t.Errorf("smembers: %d, want 3 (today, then the day before with the lease, then today again)", got)
	}
}

// An idle lease stays known until it has expired in Redis: the user's
// next message, after two thirds of it, continues it and keeps the days it
// knows.
func TestUsersIdleLeaseIsContinuedWithItsDaysUntilItExpires(t *testing.T) {
	o := newOneMessageDone(t)
	o.setAge(7 * time.Second)           // past two thirds of the 10s lease: no longer trusted
	time.Sleep(1800 * time.Millisecond) // two keep ticks, and still short of the whole lease
	if l, _ := o.lease(); l == nil {
		t.Fatal("an idle lease was forgotten before it could have expired in Redis")
	}
	o.wantRun(t, o.run(t, items(o.now, "k:1", "k:2")), StatusDuplicate, StatusExecuted)
	if got := o.count.get("smembers"); got != 1 {
		t.Errorf("smembers: %d, want 1 (the lease was still this process's: its day is known)", got)
	}
	o.setAge(10500 * time.Millisecond)
	waitFor(t, 3*time.Second, func() bool { l, _ := o.lease(); return l == nil })
}
