package state

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newStore returns a store on rdb; lease 600ms unless mutate changes it.
func newStore(t *testing.T, rdb redis.UniversalClient, prefix, owner string, mutate func(*Config)) *Store {
	t.Helper()
	cfg := Config{Client: rdb, KeyPrefix: prefix, Owner: owner, Lease: 600 * time.Millisecond, TTL: 169 * time.Hour}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func acquire(t *testing.T, s *Store, topic string, p int32, within time.Duration) *Lease {
	t.Helper()
	l, err := s.Acquire(ctxT(t, within), topic, p)
	if err != nil {
		t.Fatalf("Acquire by %s: %v", s.Owner(), err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

func msgs(sendTime int64, keys ...string) []Item {
	out := make([]Item, len(keys))
	for i, k := range keys {
		out[i] = Item{Key: k, SendTime: sendTime}
	}
	return out
}

// takenOver has owner a acquire partition p of topic "t", cuts it off
// from Redis and has owner b take the partition after the lease and the
// grace; it returns a's store, a's lease and b's.
func takenOver(t *testing.T, rdb redis.UniversalClient, prefix string, p int32) (*Store, *Lease, *Lease) {
	t.Helper()
	a := newStore(t, rdb, prefix, "a", nil)
	b := newStore(t, rdb, prefix, "b", nil)
	la := acquire(t, a, "t", p, 2*time.Second)
	cutOff(t, la)
	return a, la, acquire(t, b, "t", p, 2*time.Second)
}

// numbered is n items keyed name0, name1, … sent at sendTime.
func numbered(name string, n int, sendTime int64) []Item {
	out := make([]Item, n)
	for i := range out {
		out[i] = Item{Key: fmt.Sprintf("%s%d", name, i), SendTime: sendTime}
	}
	return out
}

// mustAllSeen fails the test unless l finds every item marked done (read
// within d); when says at what point of the test.
func mustAllSeen(t *testing.T, l *Lease, items []Item, d time.Duration, when string) {
	t.Helper()
	seen, err := l.Seen(ctxT(t, d), items)
	if err != nil {
		t.Fatalf("%s: Seen: %v", when, err)
	}
	for i, v := range seen {
		if !v {
			t.Fatalf("%s: item %d (%s) not marked", when, i, items[i].Key)
		}
	}
}

// cutOff cuts the lease's owner off from Redis (not from Kafka): its
// renewals fail, it loses the lease by its own clock, and Redis lets
// another owner take it after the lease and the grace.
func cutOff(t *testing.T, l *Lease) {
	t.Helper()
	l.cutOff.Store(true)
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a cut-off owner did not lose its lease by its own clock")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Client"},
		{Config{Client: rdb, TTL: time.Hour, Slot: 1500 * time.Millisecond}, "Slot"},
	} {
		_, err := New(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

func TestSuggestBuckets(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		parts int
		want  int
	}{{500, 64, 1}, {5000, 64, 2}, {50000, 64, 32}, {1e6, 8, 4096}} {
		got := SuggestBuckets(tc.rate, tc.parts, 10*time.Second)
		if got != tc.want {
			t.Errorf("SuggestBuckets(%v, %d) = %d, want %d", tc.rate, tc.parts, got, tc.want)
		}
		if per := tc.rate / float64(tc.parts) * 10 / float64(got); per > 400 {
			t.Errorf("SuggestBuckets(%v, %d): %.0f members a bucket", tc.rate, tc.parts, per)
		}
	}
}

func TestOwnershipHandOver(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	a := newStore(t, rdb, prefix, "a", nil)
	b := newStore(t, rdb, prefix, "b", nil)
	la := acquire(t, a, "t", 0, 2*time.Second)
	if la.PrevHW() != -1 || la.MayRepeat(0) {
		t.Fatalf("first owner: PrevHW %d MayRepeat(0) %v, want -1 false", la.PrevHW(), la.MayRepeat(0))
	}
	// Held: b waits, bounded by its context.
	if _, err := b.Acquire(ctxT(t, 300*time.Millisecond), "t", 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held partition = %v, want a deadline error", err)
	}
	// Renewal keeps it held past the lease.
	time.Sleep(800 * time.Millisecond)
	if !la.Valid() {
		t.Fatalf("lease not renewed: %v", la.Err())
	}
	if err := la.Mark(ctxT(t, time.Second), 41, msgs(1000, "k1", "k2")); err != nil {
		t.Fatal(err)
	}
	// Released: b takes it at once, with a larger token and a's high-water.
	start := time.Now()
	released := make(chan struct{})
	go func() { time.Sleep(100 * time.Millisecond); _ = la.Release(context.Background()); close(released) }()
	lb := acquire(t, b, "t", 0, 2*time.Second)
	<-released
	if took := time.Since(start); took > 400*time.Millisecond {
		t.Errorf("take-over after release took %s", took)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token %d after %d: not growing", lb.Token(), la.Token())
	}
	if lb.PrevHW() != 41 || !lb.MayRepeat(41) || lb.MayRepeat(42) {
		t.Errorf("new owner: PrevHW %d, MayRepeat(41) %v, MayRepeat(42) %v; want 41 true false", lb.PrevHW(), lb.MayRepeat(41), lb.MayRepeat(42))
	}
	seen, err := lb.Seen(ctxT(t, time.Second), msgs(1000, "k1", "k3", "k2"))
	if err != nil || !seen[0] || seen[1] || !seen[2] {
		t.Errorf("Seen = %v %v, want [true false true]", seen, err)
	}
	// Not released: the next owner waits for expiry plus the grace.
	c := newStore(t, rdb, prefix, "c", nil)
	lb.mu.Lock()
	lb.released = true // stop renewing without giving it back (a crash)
	lb.mu.Unlock()
	close(lb.stop)
	<-lb.done
	start = time.Now()
	lc := acquire(t, c, "t", 0, 3*time.Second)
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("take-over of a crashed owner's lease after %s, want its lease and grace (>= ~600ms)", took)
	}
	if lc.Token() <= lb.Token() {
		t.Errorf("token %d after %d: not growing", lc.Token(), lb.Token())
	}
}

// Hole 1: a mark refused because the lease moved still records the
// effect; a later copy is found done.
func TestHole1FencedMarkIsRecorded(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	a := newStore(t, rdb, prefix, "a", nil)
	b := newStore(t, rdb, prefix, "b", nil)
	la := acquire(t, a, "t", 3, 2*time.Second)
	// a is cut off from Redis (not from Kafka): its lease runs out, b
	// takes the partition; a's handler had succeeded meanwhile.
	cutOff(t, la)
	lb := acquire(t, b, "t", 3, 2*time.Second)
	err := la.Mark(ctxT(t, time.Second), 7, msgs(500, "eff"))
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("Mark by the fenced owner = %v, want ErrFenced", err)
	}
	if la.Valid() {
		t.Error("a fenced lease is valid")
	}
	seen, err := lb.Seen(ctxT(t, time.Second), msgs(500, "eff"))
	if err != nil || !seen[0] {
		t.Fatalf("a re-pulled copy after a fenced mark: Seen = %v %v, want done", seen, err)
	}
	// And the high-water moved, so the offset is looked up by the next owner.
	if hw, _ := rdb.HGet(context.Background(), a.ownKey("t", 3), "hw").Int64(); hw != 7 {
		t.Errorf("hw after the fenced mark = %d, want 7", hw)
	}
}

// Hole 2: a late plain mark of the old owner is visible to the new owner:
// look-ups read Redis when the message runs, not a copy taken at takeover.
func TestHole2LateMarkSeenByNewOwner(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	_, la, lb := takenOver(t, rdb, prefix, 1)
	if seen, err := lb.Seen(ctxT(t, time.Second), msgs(900, "late")); err != nil || seen[0] {
		t.Fatalf("before the late mark: %v %v", seen, err)
	}
	// a was paused after its own check; its mark lands now.
	if err := la.Mark(ctxT(t, time.Second), 12, msgs(900, "late")); !errors.Is(err, ErrFenced) {
		t.Fatalf("late mark = %v, want ErrFenced", err)
	}
	for i := 0; i < 3; i++ { // b asks again each time the message comes up
		if seen, err := lb.Seen(ctxT(t, time.Second), msgs(900, "late")); err != nil || !seen[0] {
			t.Fatalf("after the late mark (look-up %d): %v %v, want done", i, seen, err)
		}
	}
}

// Hole 3: a lease that was lost is never used again silently: it says so
// (Lost, Err), its marks are fenced, renewal does not take it back, and
// the owner must Acquire anew (a new token, renewed).
func TestHole3LostLeaseStaysLost(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	a, la, lb := takenOver(t, rdb, prefix, 2)
	// The stated window: the new owner starts no earlier than the grace
	// after the old owner's own deadline (one machine, one clock here).
	if took, dl := time.Now(), la.Deadline(); took.Before(dl.Add(a.grace())) {
		t.Errorf("new owner started %s after the old owner's deadline, want >= the grace %s", took.Sub(dl), a.grace())
	}
	select {
	case <-la.Lost():
	case <-time.After(time.Second):
		t.Fatal("the old owner was not told its lease was taken (renewal)")
	}
	if !errors.Is(la.Check(), ErrLost) {
		t.Errorf("Check = %v, want ErrLost", la.Check())
	}
	la.cutOff.Store(false) // reachable again: nothing brings the lease back
	_ = lb.Release(context.Background())
	// Even with the partition free again, the lost lease stays lost.
	time.Sleep(300 * time.Millisecond)
	if la.Valid() {
		t.Fatal("a lost lease became valid again")
	}
	if err := la.Mark(ctxT(t, time.Second), 3, msgs(1, "x")); !errors.Is(err, ErrFenced) {
		t.Errorf("Mark on a lost lease after release = %v, want ErrFenced", err)
	}
	la2 := acquire(t, a, "t", 2, 2*time.Second)
	if la2.Token() <= lb.Token() {
		t.Errorf("re-acquired token %d <= %d", la2.Token(), lb.Token())
	}
	time.Sleep(900 * time.Millisecond)
	if !la2.Valid() {
		t.Errorf("re-acquired lease not renewed: %v", la2.Err())
	}
}

// Hole 3, the outage path: an owner cut off from Redis loses its lease by
// its own clock before Redis lets another owner take it.
func TestLeaseLostWhenRedisUnreachable(t *testing.T) {
	addr := testenv.PrivateRedis(t, "--dir", t.TempDir())
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	s := newStore(t, rdb, "p:", "a", nil)
	l := acquire(t, s, "t", 0, 2*time.Second)
	if err := rdb.Do(context.Background(), "client", "pause", 3000, "all").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-l.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("lease not lost while Redis was unreachable")
	}
	if took := time.Since(start); took > 700*time.Millisecond {
		t.Errorf("lost after %s, want within the lease (600ms)", took)
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
}

// Hole 4: the token grows across a Sentinel-style failover where the
// promoted replica lacks the last acquisition.
func TestHole4TokenGrowsAcrossFailover(t *testing.T) {
	master := testenv.PrivateRedis(t, "--dir", t.TempDir())
	replica := testenv.PrivateRedis(t, "--dir", t.TempDir())
	mc := redis.NewClient(&redis.Options{Addr: master})
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer mc.Close()
	defer rc.Close()
	ctx := ctxT(t, 20*time.Second)
	host, port, _ := strings.Cut(master, ":")
	if err := rc.Do(ctx, "replicaof", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	a := newStore(t, mc, "p:", "a", nil)
	la := acquire(t, a, "t", 0, 2*time.Second)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait until the replica has the record.
	for {
		if v, _ := rc.HGet(ctx, a.ownKey("t", 0), "token").Result(); v == la.tokenS {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("replica never caught up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The failover: the replica is promoted; the master's last write (a
	// new acquisition) does not reach it.
	if err := rc.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
		t.Fatal(err)
	}
	c := newStore(t, mc, "p:", "c", nil)
	lc := acquire(t, c, "t", 0, 2*time.Second) // on the old master, lost with it
	if lc.Token() <= la.Token() {
		t.Fatalf("token %d after %d", lc.Token(), la.Token())
	}
	time.Sleep(2 * time.Millisecond)
	d := newStore(t, rc, "p:", "d", nil)
	ld := acquire(t, d, "t", 0, 2*time.Second) // on the promoted replica
	if ld.Token() <= lc.Token() {
		t.Fatalf("token after failover %d <= the lost acquisition's %d: a downstream keeping the largest token cannot fence the old owner", ld.Token(), lc.Token())
	}
}

// Hole 5: after Redis lost its script cache, a mark over several buckets
// (several keys) is re-run whole and accepted.
func TestHole5MarkAfterScriptFlush(t *testing.T) {
	addr := testenv.PrivateRedis(t, "--dir", t.TempDir())
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	s := newStore(t, rdb, "p:", "a", func(c *Config) { c.Buckets = 8 })
	l := acquire(t, s, "t", 0, 2*time.Second)
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	items := numbered("k", 40, 1000)
	if err := l.Mark(ctxT(t, time.Second), 40, items); err != nil {
		t.Fatalf("Mark after SCRIPT FLUSH = %v, want accepted", err)
	}
	mustAllSeen(t, l, items, time.Second, "after SCRIPT FLUSH")
}

// Hole 6: marks live TTL after their last write whatever the message's
// send time: a letter retried 4 days later, whose message (sent 4 days
// ago) was done by a copy, is recognised. (The config refuses a TTL
// shorter than the DLQ's retry horizon.)
func TestHole6OldLetterRecognised(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", func(c *Config) { c.TTL = 168 * time.Hour })
	l := acquire(t, s, "t", 0, 2*time.Second)
	sent := time.Now().Add(-4 * 24 * time.Hour).Unix()
	if err := l.Mark(ctxT(t, time.Second), 5, msgs(sent, "old")); err != nil {
		t.Fatal(err)
	}
	k := s.bucketKey(s.tag("t", 0), l.layout(), sent, Digest("old"))
	ttl, err := rdb.TTL(context.Background(), k).Result()
	if err != nil || ttl < 168*time.Hour {
		t.Fatalf("bucket TTL = %s %v, want >= 168h (the DLQ's retry horizon)", ttl, err)
	}
	seen, err := s.Seen(ctxT(t, time.Second), "t", 0, msgs(sent, "old"))
	if err != nil || !seen[0] {
		t.Fatalf("4-day-old letter: Seen = %v %v, want done", seen, err)
	}
}

// The buckets are intsets: ~8 bytes a member.
func TestBucketsAreIntsets(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", nil)
	l := acquire(t, s, "t", 0, 2*time.Second)
	var items []Item
	for i := range 400 {
		items = append(items, Item{Key: fmt.Sprintf("wkKKKK:%08x-0000-4000-8000-%012x", i, i), SendTime: 2000})
	}
	if err := l.Mark(ctxT(t, time.Second), 399, items); err != nil {
		t.Fatal(err)
	}
	k := s.bucketKey(s.tag("t", 0), l.layout(), 2000, 0)
	enc, err := rdb.ObjectEncoding(context.Background(), k).Result()
	if err != nil || enc != "intset" {
		t.Fatalf("bucket encoding %q %v, want intset", enc, err)
	}
	if n, _ := rdb.SCard(context.Background(), k).Result(); n != 400 {
		t.Fatalf("bucket has %d members, want 400", n)
	}
	mem, err := rdb.MemoryUsage(context.Background(), k).Result()
	if err != nil || float64(mem)/400 > 10 {
		t.Fatalf("bucket memory %d B for 400 members (%v), want <= 10 B a member", mem, err)
	}
}

// Migration from claims: for one TTL after the switch the old per-message
// keys are read: a done marker is Done, a running claim is Held (never
// run beside it), no key is Fresh. A partition never owned under this
// store treats everything below the log end as a possible repeat.
func TestLegacyClaimsRead(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	old := prefix + "dedup:"
	ctx := ctxT(t, 5*time.Second)
	// As store claims leaves them: "d:" once done, "p:<owner>:<seq>" while claimed.
	rdb.Set(ctx, old+"kf:done", "d:", time.Hour)
	rdb.Set(ctx, old+"kf:running", "p:schedule-consumer:abc:1", time.Minute)
	s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Legacy = &Legacy{Prefix: old, Claims: true} })
	l := acquire(t, s, "t", 0, 2*time.Second)
	if l.MayRepeat(0) {
		t.Fatal("MayRepeat before SetLogEnd")
	}
	l.SetLogEnd(100)
	if !l.MayRepeat(99) || l.MayRepeat(100) {
		t.Fatalf("after SetLogEnd(100): MayRepeat(99) %v MayRepeat(100) %v, want true false", l.MayRepeat(99), l.MayRepeat(100))
	}
	st, err := l.Look(ctx, msgs(1000, "kf:done", "kf:running", "kf:new"))
	if err != nil {
		t.Fatal(err)
	}
	if st[0] != Done || st[1] != Held || st[2] != Fresh {
		t.Fatalf("Look = %v, want [done held fresh]", st)
	}
	// Without Legacy (after one TTL) the old keys are not read.
	s2 := newStore(t, rdb, prefix, "b", nil)
	if st, _ := s2.Look(ctx, "t", 0, msgs(1000, "kf:done")); st[0] != Fresh {
		t.Fatalf("Look without Legacy = %v, want fresh", st)
	}
}

// Migration from leases: the user's day set of FNV-1a digests is read; a
// user lease still in force is Held.
func TestLegacyLeasesRead(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	old := prefix + "dedup:"
	ctx := ctxT(t, 5*time.Second)
	sent := int64(1700000000)
	day := strconv.FormatInt(sent/86400, 10)
	// As store leases leaves them.
	rdb.SAdd(ctx, old+"u:D:wmA:"+day, fnvDigest("kf:a1"))
	rdb.Set(ctx, old+"u:L:wmB", "7:schedule-consumer:abc", time.Minute)
	s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Legacy = &Legacy{Prefix: old, Leases: true} })
	items := []Item{{Key: "kf:a1", SendTime: sent, User: "wmA"}, {Key: "kf:a2", SendTime: sent, User: "wmA"},
		{Key: "kf:b1", SendTime: sent, User: "wmB"}}
	st, err := s.Look(ctx, "t", 0, items)
	if err != nil {
		t.Fatal(err)
	}
	if st[0] != Done || st[1] != Fresh || st[2] != Held {
		t.Fatalf("Look = %v, want [done fresh held]", st)
	}
	// The leases store's digest, checked against hash/fnv.
	h := fnv.New64a()
	h.Write([]byte("kf:a1"))
	if int64(h.Sum64()) != fnvDigest("kf:a1") {
		t.Fatal("fnvDigest differs from FNV-1a 64")
	}
}

// The marker batches a partition's marks: many messages, few calls, every
// done called once after its mark was recorded, hw the largest offset.
func TestMarkerBatches(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", nil)
	l := acquire(t, s, "t", 0, 2*time.Second)
	m := l.NewMarker(20*time.Millisecond, 100)
	var mu sync.Mutex
	var items []Item
	done := map[int64]error{}
	for i := range 1000 {
		it := Item{Key: fmt.Sprintf("k%d", i), SendTime: 5000}
		items = append(items, it)
		off := int64(i)
		m.Add(it, off, func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := done[off]; dup {
				t.Errorf("done called twice for %d", off)
			}
			done[off] = err
		})
	}
	m.Close()
	if len(done) != 1000 {
		t.Fatalf("%d dones, want 1000", len(done))
	}
	for off, err := range done {
		if err != nil {
			t.Fatalf("mark %d: %v", off, err)
		}
	}
	if m.sends > 20 {
		t.Errorf("%d Mark calls for 1000 messages in batches of 100", m.sends)
	}
	mustAllSeen(t, l, items, time.Second, "after the marker's batches")
	if hw, _ := rdb.HGet(context.Background(), s.ownKey("t", 0), "hw").Int64(); hw != 999 {
		t.Errorf("hw %d, want 999", hw)
	}
	// After Close, Add fails at once.
	var got error
	m.Add(Item{Key: "late"}, 1000, func(err error) { got = err })
	if !errors.Is(got, ErrMarkerClosed) {
		t.Errorf("Add after Close: %v, want ErrMarkerClosed", got)
	}
}

// A fenced marker's marks are recorded and every done says ErrFenced.
func TestMarkerFenced(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	_, la, lb := takenOver(t, rdb, prefix, 0)
	m := la.NewMarker(time.Millisecond, 10)
	errs := make(chan error, 3)
	for i := range 3 {
		m.Add(Item{Key: fmt.Sprintf("f%d", i), SendTime: 1}, int64(i), func(err error) { errs <- err })
	}
	m.Close()
	for range 3 {
		if err := <-errs; !errors.Is(err, ErrFenced) {
			t.Fatalf("done = %v, want ErrFenced", err)
		}
	}
	seen, _ := lb.Seen(ctxT(t, time.Second), msgs(1, "f0", "f1", "f2"))
	if !seen[0] || !seen[1] || !seen[2] {
		t.Fatalf("fenced marks not recorded: %v", seen)
	}
}

// A batch larger than Lua's unpack limit is recorded in several calls.
func TestMarkLargeBatch(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", nil)
	l := acquire(t, s, "t", 0, 2*time.Second)
	items := numbered("big", 9000, 7)
	if err := l.Mark(ctxT(t, 5*time.Second), 8999, items); err != nil {
		t.Fatalf("Mark of 9000 = %v", err)
	}
	mustAllSeen(t, l, items, 5*time.Second, "after a Mark of 9000")
}

// TestDoneAnywhere: a reader that knows a message but not its partition
// (the admin, the DLQ's settling) finds the marks of every partition — on
// one Redis and on a Redis Cluster, where the partitions' keys live on
// different masters and one SCAN would see only one of them.
func TestDoneAnywhere(t *testing.T) {
	cluster, cprefix := testenv.RedisCluster(t)
	single, sprefix := testenv.Redis(t)
	for _, tc := range []struct {
		name   string
		rdb    redis.UniversalClient
		prefix string
	}{{"single", single, sprefix}, {"cluster", cluster, cprefix}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.rdb, tc.prefix, "a", nil)
			const parts = 8
			var marked, unmarked []Item
			for p := range int32(parts) {
				l := acquire(t, s, "topic", p, 5*time.Second)
				it := msgs(1_700_000_000+int64(p), fmt.Sprintf("kf:done-%d", p))
				if err := l.Mark(ctxT(t, 5*time.Second), 0, it); err != nil {
					t.Fatalf("Mark on partition %d: %v", p, err)
				}
				marked = append(marked, it...)
				unmarked = append(unmarked, msgs(1_700_000_000+int64(p), fmt.Sprintf("kf:never-%d", p))...)
			}
			if tc.name == "cluster" {
				nodes := map[string]bool{}
				for p := range int32(parts) {
					addr, err := cluster.MasterForKey(ctxT(t, 5*time.Second), s.ownKey("topic", p))
					if err != nil {
						t.Fatal(err)
					}
					nodes[addr.Options().Addr] = true
				}
				if len(nodes) < 2 {
					t.Fatalf("the %d partitions' keys are on %d master(s); the test needs them spread", parts, len(nodes))
				}
			}
			got, err := DoneAnywhere(ctxT(t, 10*time.Second), tc.rdb, tc.prefix, append(marked, unmarked...))
			if err != nil {
				t.Fatal(err)
			}
			for i, done := range got {
				if want := i < len(marked); done != want {
					t.Errorf("item %d (%s): done %v, want %v", i, append(marked, unmarked...)[i].Key, done, want)
				}
			}
		})
	}
}

// TestRepliesBesideMarks: a message's replies are recorded under the
// partition's hash tag with the value the reply path keeps, read back by
// the next owner, found by RepliedAnywhere (the timeline), and expire with
// the marks.
func TestRepliesBesideMarks(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	a := newStore(t, rdb, prefix, "a", nil)
	l := acquire(t, a, "topic", 3, 5*time.Second)
	ctx := ctxT(t, 10*time.Second)
	sent := Item{Key: "wk:m1:0", SendTime: 1_700_000_123}
	if _, found, err := l.Replied(ctx, sent); err != nil || found {
		t.Fatalf("Replied before RecordReply: found %v, err %v", found, err)
	}
	if err := l.RecordReply(ctx, sent, "fp\x00msgcode"); err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	b := newStore(t, rdb, prefix, "b", nil)
	lb := acquire(t, b, "topic", 3, 5*time.Second)
	if rec, found, err := lb.Replied(ctx, sent); err != nil || !found || rec != "fp\x00msgcode" {
		t.Fatalf("the next owner reads (%q, %v, %v), want the record", rec, found, err)
	}
	other := Item{Key: "wk:m1:1", SendTime: sent.SendTime}
	got, err := RepliedAnywhere(ctx, rdb, prefix, []Item{sent, other})
	if err != nil || !got[0] || got[1] {
		t.Fatalf("RepliedAnywhere = %v, %v; want [true false]", got, err)
	}
	k := b.replyKey(b.tag("topic", 3), sent.SendTime)
	if !strings.Contains(k, "{topic:3}") {
		t.Fatalf("reply key %q lacks the partition's hash tag", k)
	}
	if ttl := rdb.PTTL(ctx, k).Val(); ttl < b.cfg.TTL || ttl > b.cfg.TTL+b.cfg.TTL/64 {
		t.Fatalf("reply hash TTL %s, want the marks' %s (+1/64)", ttl, b.cfg.TTL)
	}
}

// TestBucketsConfigDoesNotFlipLayout: a consumer configured with another
// dedup.buckets (a rolling restart) keeps the recorded layout, and every
// mark stays found by owners and readers alike.
func TestBucketsConfigDoesNotFlipLayout(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := ctxT(t, 20*time.Second)
	now := time.Now().Unix()
	var all []Item
	for i := range 64 {
		all = append(all, Item{Key: fmt.Sprintf("wk:before-%d", i), SendTime: now - 3600})
	}
	one := newStore(t, rdb, prefix, "one", func(c *Config) { c.Buckets = 1 })
	l1 := acquire(t, one, "t", 0, 5*time.Second)
	if err := l1.Mark(ctx, 10, all); err != nil {
		t.Fatal(err)
	}
	_ = l1.Release(ctx)
	eight := newStore(t, rdb, prefix, "eight", func(c *Config) { c.Buckets = 8 })
	l8 := acquire(t, eight, "t", 0, 5*time.Second)
	if got := l8.layout(); len(got.gens) != 1 || got.gens[0].bk != 1 {
		t.Fatalf("layout after a consumer configured with 8 took the partition: %+v, want the recorded 1 bucket", got)
	}
	for i := range 64 {
		all = append(all, Item{Key: fmt.Sprintf("wk:after-%d", i), SendTime: now + 60})
	}
	if err := l8.Mark(ctx, 20, all[64:]); err != nil {
		t.Fatal(err)
	}
	for _, look := range []func() ([]bool, error){
		func() ([]bool, error) { return l8.Seen(ctx, all) },
		func() ([]bool, error) { return DoneAnywhere(ctx, rdb, prefix, all) },
	} {
		got, err := look()
		if err != nil {
			t.Fatal(err)
		}
		for i, ok := range got {
			if !ok {
				t.Fatalf("%s not found", all[i].Key)
			}
		}
	}
}

// TestLookerBatches: concurrent look-ups of two partitions go together in
// few pipelines and each gets what Look would answer; a look-up asked
// after a mark landed sees it (the Looker reads Redis, never a copy).
func TestLookerBatches(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Buckets = 4 })
	ctx := ctxT(t, 20*time.Second)
	l0, l1 := acquire(t, s, "t", 0, 5*time.Second), acquire(t, s, "t", 1, 5*time.Second)
	lk := s.NewLooker(256)
	defer lk.Close()
	if err := l0.Mark(ctx, 1, msgs(100, "done-0")); err != nil {
		t.Fatal(err)
	}
	if err := l1.Mark(ctx, 1, msgs(100, "done-1")); err != nil {
		t.Fatal(err)
	}
	before := rdb.Info(ctx, "commandstats").Val()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, key := l0, fmt.Sprintf("fresh-%d", i)
			if i%2 == 1 {
				l = l1
			}
			if i%10 == 0 {
				key = "done-" + strconv.Itoa(i%2)
			}
			st, err := lk.Look(ctx, l, msgs(100, key))
			switch {
			case err != nil:
				errs <- err
			case (st[0] == Done) != strings.HasPrefix(key, "done-"):
				errs <- fmt.Errorf("%s on partition %d: %v", key, i%2, st[0])
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	after := rdb.Info(ctx, "commandstats").Val()
	calls := func(info string) int {
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_smismember:calls="); ok {
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				return n
			}
		}
		return 0
	}
	if n := calls(after) - calls(before); n >= 200 {
		t.Errorf("200 concurrent look-ups made %d SMISMEMBER calls: not batched", n)
	}
	if err := l0.Mark(ctx, 2, msgs(100, "late")); err != nil {
		t.Fatal(err)
	}
	if st, err := lk.Look(ctx, l0, msgs(100, "late")); err != nil || st[0] != Done {
		t.Fatalf("a look-up after the mark landed: %v %v, want done", st, err)
	}
}

// markAll queues items on m and waits until every mark is recorded.
func markAll(t *testing.T, m *Marker, items []Item, off int64) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for i, it := range items {
		wg.Add(1)
		m.Add(it, off+int64(i), func(err error) {
			if err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatalf("mark: %v", failed)
	}
}

// TestLayoutFollowsRate (issue 43, item 4): no operator sizing. A
// partition's buckets follow its observed rate per send-time slot: a 40×
// jump turns into more buckets from the next slot on, so the jump's slots
// stay intsets, and a drop back into one bucket after the shrink spacing;
// a mark written late into a slot of each earlier generation is found by
// the owner, by a later owner and by Store.Look.
func TestLayoutFollowsRate(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		ctx := ctxT(t, 60*time.Second)
		s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Slot = time.Second; c.Lease = 2 * time.Second })
		l := acquire(t, s, "t", 0, 5*time.Second)
		m := l.NewMarker(time.Millisecond, 1000)
		base := time.Now().Unix() - 3600
		var all []Item
		slotItems := func(slot int64, n int, name string) []Item {
			out := make([]Item, n)
			for i := range out {
				out[i] = Item{Key: fmt.Sprintf("%s-%d-%d", name, slot, i), SendTime: base + slot}
			}
			all = append(all, out...)
			return out
		}
		off := int64(0)
		run := func(from, to int64, n int, name string) {
			for sl := from; sl < to; sl++ {
				items := slotItems(sl, n, name)
				markAll(t, m, items, off)
				off += int64(n)
			}
		}
		run(0, 4, 50, "calm")    // 50 a slot: 1 bucket
		run(4, 10, 2000, "jump") // 40×: 2000 a slot
		jumpBk := l.layout().bucketsAt(s.slotOf(base + 9))
		if jumpBk < 4 {
			t.Fatalf("after a 40x jump the partition has %d buckets a slot, want >= 4 (layout %+v)", jumpBk, l.layout())
		}
		// Every bucket of the jump's slots after the first is an intset.
		for sl := int64(6); sl < 10; sl++ {
			keys, err := scanAll(ctx, rdb, l.tag+":d:"+strconv.FormatInt(s.slotOf(base+sl), 10)+":*")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				enc, err := rdb.ObjectEncoding(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if enc != "intset" {
					t.Fatalf("bucket %s of the jump is %s (%d keys in the slot), want intset", k, enc, len(keys))
				}
			}
		}
		run(10, 10+shrinkEvery+6, 50, "calm-again")
		if got := l.layout().bucketsAt(s.slotOf(base + 10 + shrinkEvery + 5)); got != 1 {
			t.Fatalf("after the rate fell back the partition has %d buckets a slot, want 1 (layout %+v)", got, l.layout())
		}
		if n := len(l.layout().gens); n < 3 {
			t.Fatalf("layout %+v: want 3 generations", l.layout())
		}
		// Late marks (a backlog, a letter retried) into a slot of each
		// earlier generation, written after the later changes.
		late := append(append(slotItems(1, 20, "late"), slotItems(7, 20, "late")...), slotItems(12, 20, "late")...)
		markAll(t, m, late, off)
		m.Close()
		mustAllSeen(t, l, all, 10*time.Second, "the owner")
		_ = l.Release(ctx)
		b := newStore(t, rdb, prefix, "b", func(c *Config) { c.Slot = time.Second; c.Lease = 2 * time.Second; c.Buckets = 16 })
		lb := acquire(t, b, "t", 0, 5*time.Second)
		mustAllSeen(t, lb, all, 10*time.Second, "the next owner")
		st, err := b.Look(ctx, "t", 0, all)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range st {
			if v != Done {
				t.Fatalf("Store.Look: %s not found", all[i].Key)
			}
		}
	})
}

// TestMarkerAdmitHoldsEffects (issue 43, item 3): the effect→mark window
// is bounded by backpressure. While a partition's marks cannot be written
// Admit holds the next attempt (no new effect); once they land it admits
// at once.
func TestMarkerAdmitHoldsEffects(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Lease = 5 * time.Second })
		l := acquire(t, s, "t", 0, 5*time.Second)
		m := l.NewMarker(5*time.Millisecond, 100)
		defer m.Close()
		if err := m.Admit(ctxT(t, time.Second)); err != nil {
			t.Fatalf("Admit with nothing queued: %v", err)
		}
		l.marksCutOff.Store(true)
		recorded := make(chan error, 1)
		it := Item{Key: "wk:admit-1", SendTime: time.Now().Unix()}
		m.Add(it, 1, func(err error) { recorded <- err })
		// The marker tries, fails and tries again; meanwhile no attempt
		// is admitted.
		time.Sleep(100 * time.Millisecond)
		held := 2 * MaxMarkLag
		t0 := time.Now()
		if err := m.Admit(ctxT(t, held)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Admit while the marks cannot be written returned %v after %s, want it held for %s", err, time.Since(t0), held)
		}
		l.marksCutOff.Store(false)
		t0 = time.Now()
		if err := m.Admit(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("Admit once the marks can be written: %v", err)
		}
		if d := time.Since(t0); d > MaxMarkLag+time.Second {
			t.Fatalf("Admit took %s after the marks could be written again", d)
		}
		select {
		case err := <-recorded:
			if err != nil {
				t.Fatalf("mark: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the mark was not recorded once Redis answered")
		}
		mustAllSeen(t, l, []Item{it}, 5*time.Second, "after the outage")
	})
}

// TestLayoutGrowsWhenSlotsInterleave: 900 marks a slot, each slot's last
// 600 marked after the next slot's first 300 (the partition's customers
// handled concurrently, some behind) — the layout still grows. Sized when
// the next slot opened, each slot counted 300 and the layout stayed at one
// bucket (the nemesis's layout-change: 3 of 3 rate jumps of 630–930 marks a
// slot changed nothing).
func TestLayoutGrowsWhenSlotsInterleave(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		s := newStore(t, rdb, prefix, "a", func(c *Config) { c.Slot = time.Second; c.Lease = 2 * time.Second })
		l := acquire(t, s, "t", 0, 5*time.Second)
		m := l.NewMarker(time.Millisecond, 1000)
		base := time.Now().Unix() - 3600
		item := func(name string, slot int64, i int) Item {
			return Item{Key: fmt.Sprintf("%s-%d-%d", name, slot, i), SendTime: base + slot}
		}
		off := int64(0)
		mark := func(its []Item) { markAll(t, m, its, off); off += int64(len(its)) }
		for sl := int64(0); sl < 3; sl++ {
			var its []Item
			for i := range 50 {
				its = append(its, item("calm", sl, i))
			}
			mark(its)
		}
		var tail []Item
		for sl := int64(3); sl < 9; sl++ {
			var head []Item
			for i := range 300 {
				head = append(head, item("jump", sl, i))
			}
			mark(head)
			mark(tail)
			tail = nil
			for i := 300; i < 900; i++ {
				tail = append(tail, item("jump", sl, i))
			}
		}
		mark(tail)
		if bk := l.layout().bucketsAt(s.slotOf(base + 8)); bk < 2 {
			t.Fatalf("900 marks a slot, interleaved: %d bucket(s) a slot at the end, want >= 2 (layout %+v)", bk, l.layout())
		}
	})
}

// TestPartitionsAddedMarksFound (issue 43, item 6): partitions are added
// to a topic; a copy of a message handled before lands in the partition
// its user has now, and every look-up (the lease's, the Looker's, the
// store's) still finds the mark written in the partition the user had.
func TestPartitionsAddedMarksFound(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		ctx := ctxT(t, 20*time.Second)
		count, parts := partitionCount("t", 4)
		// Users that move when 4 partitions become 8.
		moved := movedUsers("wm-user-", 20)
		markWhereTheyWere(t, ctx, newStore(t, rdb, prefix, "a", parts), moved)
		time.Sleep(1100 * time.Millisecond) // the new count is first seen a second later
		count.Store("t", 8)
		b := newStore(t, rdb, prefix, "b", parts)
		lk := b.NewLooker(100)
		defer lk.Close()
		for p := range int32(8) {
			var copies []Item
			for _, it := range moved {
				if KeyPartition(it.User, 8) == p {
					copies = append(copies, it)
				}
			}
			if len(copies) == 0 {
				continue
			}
			l := acquire(t, b, "t", p, 5*time.Second)
			for name, look := range map[string]func() ([]Status, error){
				"lease":  func() ([]Status, error) { return l.Look(ctx, copies) },
				"looker": func() ([]Status, error) { return lk.Look(ctx, l, copies) },
				"store":  func() ([]Status, error) { return b.Look(ctx, "t", p, copies) },
			} {
				st, err := look()
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range st {
					if v != Done {
						t.Fatalf("%s look-up in partition %d after partitions were added: %s (marked in partition %d) not found",
							name, p, copies[i].Key, KeyPartition(copies[i].User, 4))
					}
				}
			}
		}
	})
}

// TestPartitionCountKnownAfterTheWait: a consumer whose store read the
// topic's count history (one count: 4) before partitions were added keeps
// it up to historyRefresh. A daemon started with the new count (8) records
// it and waits RecordPartitionCount's answer before it places or reads a
// message; after that wait the consumer's look-up of a moved user's copy
// asks the partition the user had and finds the mark. (Without the wait
// the copy, read at once, was not found: the nemesis's partitions-added
// step, a producer copy taking effect twice.)
func TestPartitionCountKnownAfterTheWait(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		ctx := ctxT(t, 40*time.Second)
		count, parts := partitionCount("t", 4)
		if wait, err := RecordPartitionCount(ctx, rdb, prefix, "t", 4); err != nil || wait != 0 {
			t.Fatalf("the topic's first count: wait %s (%v), want none", wait, err)
		}
		moved := movedUsers("wk-user-", 10)
		markWhereTheyWere(t, ctx, newStore(t, rdb, prefix, "a", parts), moved)
		// The consumer's store reads the history while it has one count.
		b := newStore(t, rdb, prefix, "b", parts)
		if _, err := b.Look(ctx, "t", 0, []Item{{Key: "wk:nobody:m1", SendTime: time.Now().Unix(), User: "nobody"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // the new count is first seen a second later
		count.Store("t", 8)
		wait, err := RecordPartitionCount(ctx, rdb, prefix, "t", 8)
		if err != nil {
			t.Fatal(err)
		}
		if wait < historyRefresh {
			t.Fatalf("a new count: wait %s, want at least the %s a store keeps its history", wait, historyRefresh)
		}
		time.Sleep(wait)
		for p := range int32(8) {
			var copies []Item
			for _, it := range moved {
				if KeyPartition(it.User, 8) == p {
					copies = append(copies, it)
				}
			}
			if len(copies) == 0 {
				continue
			}
			l := acquire(t, b, "t", p, 5*time.Second)
			st, err := l.Look(ctx, copies)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range st {
				if v != Done {
					t.Fatalf("partition %d, after the new count's wait: %s (marked in partition %d) not found",
						p, copies[i].Key, KeyPartition(copies[i].User, 4))
				}
			}
			_ = l.Release(ctx)
		}
		if wait, err := RecordPartitionCount(ctx, rdb, prefix, "t", 8); err != nil || wait != 0 {
			t.Fatalf("the count recorded %s ago: wait %s (%v), want none", historyRefresh, wait, err)
		}
	})
}

// TestLiveCounts: an older partition count is asked for two TTLs after
// the next one was first seen, then no more.
func TestLiveCounts(t *testing.T) {
	s := &Store{cfg: Config{TTL: time.Hour}}
	h := []countEntry{{4, 1000}, {8, 5000}, {12, 9000}}
	for _, c := range []struct {
		now  int64
		want []int
	}{
		{9000, []int{4, 8, 12}},
		{5000 + 7199, []int{4, 8, 12}},
		{5000 + 7200, []int{8, 12}},
		{9000 + 7200, []int{12}},
	} {
		if got := s.liveCounts(h, time.Unix(c.now, 0)); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("at %d: %v, want %v", c.now, got, c.want)
		}
	}
}

// TestStaleLayoutMarkRebucketed: a former owner (cut off, its lease
// taken over) whose layout predates the new owner's change writes a late
// mark into a slot of the new generation: the mark script refuses the
// stale buckets, the lease reads the layout again, and the mark lands
// where the new owner looks.
func TestStaleLayoutMarkRebucketed(t *testing.T) {
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		ctx := ctxT(t, 20*time.Second)
		a, la, lb := takenOver(t, rdb, prefix, 0)
		now := time.Now().Unix()
		from := a.slotOf(now) + 1
		if changed, err := lb.relayout(ctx, from, 8); err != nil || !changed {
			t.Fatalf("relayout: %v, %v", changed, err)
		}
		if la.layout().ver == lb.layout().ver {
			t.Fatal("the former owner already knows the new layout: the test proves nothing")
		}
		late := numbered("wk:late-", 40, now+2*int64(a.slotSec))
		if err := la.Mark(ctx, 5, late); !errors.Is(err, ErrFenced) {
			t.Fatalf("late mark of the former owner: %v, want ErrFenced (recorded)", err)
		}
		mustAllSeen(t, lb, late, 5*time.Second, "the new owner after the former owner's late mark")
	})
}

// partitionCount is a Config option whose topic has the count held in
// the returned map (topic → int), starting at n.
func partitionCount(topic string, n int) (*sync.Map, func(*Config)) {
	var count sync.Map
	count.Store(topic, n)
	return &count, func(c *Config) {
		c.Partitions = func(_ context.Context, topic string) (int, error) {
			n, _ := count.Load(topic)
			return n.(int), nil
		}
	}
}

// movedUsers is n messages of users (named prefix + a number) whose
// partition changes when 4 partitions become 8.
func movedUsers(prefix string, n int) []Item {
	var moved []Item
	for i := 0; len(moved) < n; i++ {
		u := fmt.Sprintf("%s%d", prefix, i)
		if KeyPartition(u, 4) != KeyPartition(u, 8) {
			moved = append(moved, Item{Key: "wk:" + u + ":m1", SendTime: time.Now().Unix(), User: u})
		}
	}
	return moved
}

// markWhereTheyWere marks each of moved done in its user's partition of
// 4, under a lease of a's.
func markWhereTheyWere(t *testing.T, ctx context.Context, a *Store, moved []Item) {
	t.Helper()
	for p := range int32(4) {
		l := acquire(t, a, "t", p, 5*time.Second)
		var mine []Item
		for _, it := range moved {
			if KeyPartition(it.User, 4) == p {
				mine = append(mine, it)
			}
		}
		if err := l.Mark(ctx, 1, mine); err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
	}
}

// The old stores' marks are read only while they can exist
// (dedup.legacy: read): where no key of theirs exists at the first start
// nothing is read, ever; where one does, they are read for one TTL from
// that start, by every store of the deployment; a record past its time
// reads nothing. Look-ups read the old marks until the decision is made.
func TestLegacyReadOnlyWhileOldMarksCanExist(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := ctxT(t, 10*time.Second)
	legacy := func(c *Config) { c.Legacy = &Legacy{Prefix: prefix + "dedup:", Claims: true, Leases: true} }
	decided := func(s *Store) int64 {
		t.Helper()
		var u int64
		testenv.Eventually(t, 5*time.Second, func() error {
			u = s.legacyUntil.Load()
			return testenv.Check(u != 0, "the old stores' marks not decided yet")
		})
		return u
	}

	// A new deployment: nothing of the old stores.
	fresh := newStore(t, rdb, prefix, "a", legacy)
	if decided(fresh) != -1 || fresh.legacyOn() {
		t.Fatalf("no old key: legacyUntil %d, on %v; want -1 (nothing to read)", fresh.legacyUntil.Load(), fresh.legacyOn())
	}
	if v := rdb.Get(ctx, prefix+"st:legacy").Val(); v != "none" {
		t.Fatalf("record %q, want none", v)
	}

	// A deployment switched from the claims store: read for one TTL.
	rdb2, prefix2 := testenv.Redis(t)
	rdb2.Set(ctx, prefix2+"dedup:kf:done", "d:", time.Hour)
	legacy2 := func(c *Config) { c.Legacy = &Legacy{Prefix: prefix2 + "dedup:", Claims: true, Leases: true} }
	before := time.Now()
	first := newStore(t, rdb2, prefix2, "a", legacy2)
	until := decided(first)
	if want := before.Add(169 * time.Hour).UnixMilli(); until < want || until > want+60_000 || !first.legacyOn() {
		t.Fatalf("old key found: until %d (want about %d), on %v", until, want, first.legacyOn())
	}
	if st, err := first.Look(ctx, "t", 0, msgs(1000, "kf:done")); err != nil || st[0] != Done {
		t.Fatalf("Look of an old store's done mark = %v %v, want done", st, err)
	}
	// A later start adopts the record, though the old key is gone.
	rdb2.Del(ctx, prefix2+"dedup:kf:done")
	if later := newStore(t, rdb2, prefix2, "b", legacy2); decided(later) != until || !later.legacyOn() {
		t.Fatalf("a later start: until %d, on %v; want the first start's %d", later.legacyUntil.Load(), later.legacyOn(), until)
	}

	// One TTL after the switch: nothing read.
	rdb2.Set(ctx, prefix2+"st:legacy", strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10), 0)
	rdb2.Set(ctx, prefix2+"dedup:kf:done", "d:", time.Hour)
	past := newStore(t, rdb2, prefix2, "c", legacy2)
	decided(past)
	if past.legacyOn() {
		t.Fatal("a record past its time: the old marks still read")
	}
	if st, err := past.Look(ctx, "t", 0, msgs(1000, "kf:done")); err != nil || st[0] != Fresh {
		t.Fatalf("Look past the window = %v %v, want fresh (the old mark not read)", st, err)
	}
}
