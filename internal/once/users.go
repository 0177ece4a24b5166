package once

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Users keeps I3's state per user instead of per message: the Redis cost
// grows with the users, not with the messages.
//
// A consumer's actor already runs one user's messages one at a time, so
// instead of claiming every message it takes a lease on the user (one key,
// an owner token, renewed while the actor has work) and records each
// message it handled as a 64-bit digest of its idempotency key in a set per
// user and day of the message's send time. Redis keeps a set of up to
// set-max-intset-entries (512) integers as an intset: 8 bytes a message,
// the set expiring as a whole one dedup TTL after its last write.
//
// The protocol per message is Do's, with the lease in place of the claim:
//   - a message found in the user's set is a duplicate (its effect has
//     happened) and is not run;
//   - a user leased by another owner is waited on (never treated as done)
//     until that owner releases the lease or it expires;
//   - a failed handler leaves nothing behind, so a retry runs it again;
//   - a lease that goes two thirds of its length without a successful
//     renewal is given up before Redis can let another owner take it: the
//     running handler is told (lost) and no effect starts under it.
//
// The lease's token grows with every new lease of the user (one counter),
// so it is a fencing token: a done mark sent under a lease that another
// owner now holds is refused by Redis, and handlers get the token
// (FencingToken) to fence their own writes.
//
// While a process holds a user's lease without a break it is the only
// writer of the user's sets, so it reads each set once (SMEMBERS, when the
// lease is taken) and checks every later message from memory; done marks of
// all users are written in shared script calls. In the common case a
// message costs one SADD inside a shared call.
type Users struct {
	rdb       redis.UniversalClient
	b         *batcher
	prefix    string
	seqKey    string
	owner     string
	lease     time.Duration
	leaseMs   int64
	ttl       time.Duration
	poll      time.Duration
	opTimeout time.Duration
	legacy    Legacy
	// legacyPrefix is Client's key prefix (the per-message keys).
	legacyPrefix string
	log          *zap.Logger
	m            *usersMetrics
	now          func() time.Time

	waits waitSet // messages waiting on a user leased by another owner

	mu     sync.Mutex
	leases map[string]*userLease
	marks  []*pendingMark
	// flushing counts mark flushes in flight (at most maxFlushes).
	flushing int
	stop     chan struct{}
	lastWarn time.Time // the last wait report (keep's goroutine only)
	wg       sync.WaitGroup
	closed   bool
	once     sync.Once
}

// Legacy says how Users treats the per-message keys of Client (the store
// before Users), during a migration.
type Legacy uint8

const (
	// LegacyOff ignores them.
	LegacyOff Legacy = iota
	// LegacyRead reads them too: a message with a per-message done marker
	// is a duplicate, one with a per-message claim (a consumer of the
	// previous version is running it) is waited on. For one dedup TTL
	// after the switch.
	LegacyRead
	// LegacyReadWrite also writes a per-message done marker beside every
	// mark, so consumers of the previous version still running during a
	// rolling restart see the new version's effects.
	LegacyReadWrite
)

// ParseLegacy reads a Legacy from its config value: off, read, read_write.
func ParseLegacy(s string) (Legacy, error) {
	switch s {
	case "", "off":
		return LegacyOff, nil
	case "read":
		return LegacyRead, nil
	case "read_write":
		return LegacyReadWrite, nil
	}
	return 0, fmt.Errorf("unknown legacy mode %q (off, read, read_write)", s)
}

// UsersConfig configures Users. Zero fields take the defaults of Config.
type UsersConfig struct {
	Client redis.UniversalClient
	// KeyPrefix is the dedup prefix (Config.KeyPrefix): the per-message
	// keys of Client live under it, and Users' keys under KeyPrefix+"u:".
	KeyPrefix string
	// Lease is how long a user's lease lives without renewal: it bounds
	// how long a crashed consumer's users wait. Default 10s.
	Lease time.Duration
	// TTL is how long a done mark is kept after it was written (at least
	// WeChat's 3-day re-pull window). Default 4 days.
	TTL time.Duration
	// PollInterval is how often a user leased by another owner is looked
	// at again. Default 20ms.
	PollInterval time.Duration
	// OpTimeout bounds each Redis call. Default 3s.
	OpTimeout time.Duration
	// Batch configures the pipelines shared by the lease and check
	// commands of concurrent actors (always on).
	Batch BatchConfig
	// Legacy reads (and writes) Client's per-message keys (migration).
	Legacy Legacy
}

// maxFlushes is how many mark flushes may be in flight at once; marks
// queued meanwhile go in the next one.
const maxFlushes = 2

// maxMarksPerFlush bounds one mark script call's size.
const maxMarksPerFlush = 512

// intsetMax is Redis's default set-max-intset-entries: a day's set of one
// user stays an intset (8 bytes a member) up to this many messages.
const intsetMax = 512

// userLease is this process's view of one user's lease.
type userLease struct {
	user, key string
	// Guarded by Users.mu:
	value  string // "" when not held
	token  int64
	gen    uint64    // bumped whenever the lease is lost or taken anew
	lastOK time.Time // when the last successful acquire/renew was sent
	busy   int       // tickets not done with + marks not yet written
	lost   bool      // given up: nothing runs under value any more
	renew  bool      // a renewal is in flight
	// release: give the lease back as soon as it is not busy;
	// releasing: the release is on its way to Redis.
	release, releasing bool
	// days holds the user's done digests per day bucket read (or written)
	// under this lease; expSet is the expire-at (ms) last sent per bucket.
	days   map[int64][]int64
	expSet map[int64]int64
	// pending are the digests of marks queued or on their way, per day:
	// they survive the loss of the lease (the object lives while they
	// are busy) and join what is read when it is taken again.
	pending map[int64][]int64
	// reads counts set reads in flight; landed holds the digests of marks
	// written while one was (its answer may predate them, and they are no
	// longer pending), merged like pending, dropped when no read is left.
	reads  int
	landed map[int64][]int64
	// running are the lost callbacks of handlers running under the lease.
	running map[*UserTicket]func(error)
}

// UserTicket is one message's place under its user's lease (UsersTicket
// of ClaimUser). It belongs to one caller and is not safe for concurrent
// use.
type UserTicket struct {
	l        *userLease
	gen      uint64
	key      string
	digest   int64
	day      int64
	done     bool
	legacyP  bool // a per-message claim of the previous store was found
	err      error
	released bool
}

// Key returns the ticket's idempotency key.
func (t *UserTicket) Key() string { return t.key }

// UserItem is one message to claim under its user's lease.
type UserItem struct {
	// Key is the idempotency key (open_kfid:msgid).
	Key string
	// SendTime is when the customer sent it (unix seconds; 0 when
	// unknown): it picks the day bucket, so a re-pulled copy of the
	// message, which has the same send time, is looked up in the same set.
	SendTime int64
}

type pendingMark struct {
	l      *userLease
	value  string
	day    int64
	digest int64
	key    string
	marked func(error)
}

// NewUsers returns a Users store. It loads its scripts, so it fails when
// Redis is unreachable within ctx.
func NewUsers(ctx context.Context, serviceName string, cfg UsersConfig, opts ...Option) (*Users, error) {
	base := Config{Client: cfg.Client, KeyPrefix: cfg.KeyPrefix, Lease: cfg.Lease, PollInterval: cfg.PollInterval,
		OpTimeout: cfg.OpTimeout, Batch: cfg.Batch}
	base.Batch.Enabled = true
	base.setDefaults()
	if err := base.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("once: UsersConfig.Client is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 4 * 24 * time.Hour
	}
	o := applyOptions(opts)
	if serviceName == "" {
		serviceName = "kfpipe"
	}
	for _, s := range usersScripts {
		if err := s.Load(ctx, cfg.Client).Err(); err != nil {
			return nil, fmt.Errorf("once: load scripts: %w", err)
		}
	}
	u := &Users{
		rdb: cfg.Client, prefix: cfg.KeyPrefix + "u:", seqKey: cfg.KeyPrefix + "u:#token",
		owner: serviceName + ":" + randomID(), lease: base.Lease, leaseMs: base.Lease.Milliseconds(),
		ttl: cfg.TTL, poll: base.PollInterval, opTimeout: base.OpTimeout, legacy: cfg.Legacy,
		log: o.log, m: newUsersMetrics(serviceName, o.reg), now: time.Now,
		leases: map[string]*userLease{}, stop: make(chan struct{}),
	}
	u.b = newBatcher(cfg.Client, base.Batch, base.OpTimeout, u.m.batchOps)
	u.legacyPrefix = cfg.KeyPrefix
	u.wg.Add(1)
	go u.keep()
	return u, nil
}

// Digest is the 64-bit digest under which a message's idempotency key is
// recorded (FNV-1a). Within one user's day of at most a few thousand
// messages two keys share a digest with a probability below 1e-12.
func Digest(key string) int64 {
	// hash/fnv's New64a, inlined: no allocation per message.
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return int64(h)
}

// dayOf is the day bucket of a send time (unix seconds; 0: unknown).
func dayOf(sendTime int64) int64 {
	if sendTime <= 0 {
		return 0
	}
	return sendTime / 86400
}

func (u *Users) leaseKey(user string) string { return u.prefix + "L:" + user }
func (u *Users) doneKey(user string, day int64) string {
	return u.prefix + "D:" + user + ":" + strconv.FormatInt(day, 10)
}

// ClaimUser takes (or keeps) user's lease and looks up items in the user's
// done marks, in one round trip in the common case: the user's next
// messages, run in turn with DoTicket. A ticket whose lease could not be
// taken (another owner holds it, or Redis failed) is taken again by
// DoTicket, which waits for the other owner.
func (u *Users) ClaimUser(ctx context.Context, user string, items []UserItem) []*UserTicket {
	ts := make([]*UserTicket, len(items))
	tickets := make([]UserTicket, len(items))
	for i, it := range items {
		tickets[i] = UserTicket{key: it.Key, digest: Digest(it.Key), day: dayOf(it.SendTime)}
		ts[i] = &tickets[i]
	}
	u.mu.Lock()
	l := u.leases[user]
	if l == nil {
		l = &userLease{user: user, key: u.leaseKey(user)}
		u.leases[user] = l
	}
	l.busy += len(ts)
	for _, t := range ts {
		t.l = l
	}
	u.mu.Unlock()
	err := u.settle(ctx, l, ts, false)
	for _, t := range ts {
		t.err = err
	}
	return ts
}

// settle makes sure this process holds l and knows the done marks of the
// tickets' days, then sets each ticket's done flag. wait: when another
// owner holds the lease, poll until it is free (bounded by ctx) instead of
// returning errLeaseHeld.
func (u *Users) settle(ctx context.Context, l *userLease, ts []*UserTicket, wait bool) error {
	var w *waiter
	defer func() { u.waits.remove(w) }()
	for {
		held, err := u.ensure(ctx, l, ts)
		if err == nil && held {
			break
		}
		if errors.Is(err, errReadAgain) {
			continue
		}
		if err != nil && !errors.Is(err, errLeaseHeld) {
			return err
		}
		if !wait {
			return errLeaseHeld
		}
		if w == nil {
			w = u.waits.add("user "+l.user, u.now())
			u.m.waits.Inc()
		}
		t := time.NewTimer(u.poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	if u.legacy != LegacyOff {
		return u.readLegacy(ctx, l, ts)
	}
	return nil
}

// errLeaseHeld: another owner holds the user's lease.
var errLeaseHeld = errors.New("once: user leased by another owner")

// ensure acquires or continues l when needed and loads the done sets of the
// tickets' days not yet known; it reports whether l is held now.
func (u *Users) ensure(ctx context.Context, l *userLease, ts []*UserTicket) (bool, error) {
	now := u.now()
	u.mu.Lock()
	if l.releasing {
		u.mu.Unlock()
		return false, errLeaseHeld // until the release has landed
	}
	valid := u.startableLocked(l, now)
	// known: this process had the lease and did not lose it, so what
	// l.days holds is still true once the lease is confirmed: always while
	// it is startable, and when Redis answers that an older one (too old
	// to start under, or expired by our clock) still holds this value —
	// nobody else held it meanwhile. A lease that expired comes back new,
	// and its days are read then (errReadAgain). Otherwise every day the
	// tickets need is read, in the acquisition's pipeline: which days to
	// read is only known once the lease is ours, but reading them with it
	// saves the round trip; the answers are used only when it was taken.
	known := l.value != "" && !l.lost // startable implies it
	prev := l.value
	var missing []int64
	for _, t := range ts {
		if _, ok := l.days[t.day]; (!known || !ok) && !slices.Contains(missing, t.day) {
			missing = append(missing, t.day)
		}
	}
	if valid && len(missing) == 0 {
		u.markKnown(l, ts)
		u.mu.Unlock()
		return true, nil
	}
	l.reads++
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		if l.reads--; l.reads == 0 {
			l.landed = nil
		}
		u.mu.Unlock()
	}()

	var cmds [][]any
	var scripts []*redis.Script
	if !valid {
		scripts = append(scripts, leaseAcquireScript)
		cmds = append(cmds, []any{"evalsha", leaseAcquireScript.Hash(), 2, l.key, u.seqKey, u.owner, u.leaseMs})
	}
	for _, d := range missing {
		scripts = append(scripts, nil)
		cmds = append(cmds, []any{"smembers", u.doneKey(l.user, d)})
	}
	res := make([]any, len(cmds))
	errs := make([]error, len(cmds))
	sent := u.now()
	u.b.doAll(ctx, scripts, cmds, res, errs)
	for _, err := range errs {
		if err != nil {
			return false, fmt.Errorf("once: lease %q: %w", l.user, err)
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock() // runs before the reads' decrement above
	sets := res
	if !valid {
		code, value, err := parseAcquire(res[0])
		if err != nil {
			return false, err
		}
		if code == 0 {
			return false, errLeaseHeld
		}
		if code == 2 || l.value != prev || l.lost {
			// A new lease: what was known of the user's marks may have
			// changed under another owner.
			l.days, l.expSet = nil, nil
			l.gen++
			u.m.acquired.Inc()
		} else {
			u.m.continued.Inc()
		}
		l.value, l.lost, l.lastOK = value, false, sent
		l.token, _ = strconv.ParseInt(value[:strings.IndexByte(value, ':')], 10, 64)
		sets = res[1:]
	}
	if l.days == nil {
		l.days = map[int64][]int64{}
	}
	for i, d := range missing {
		if _, ok := l.days[d]; ok {
			continue
		}
		members, _ := sets[i].([]any)
		ds := make([]int64, 0, len(members))
		for _, m := range members {
			if s, ok := m.(string); ok {
				if v, err := strconv.ParseInt(s, 10, 64); err == nil {
					ds = append(ds, v)
				}
			}
		}
		// Marks of this process not written yet (Redis was out, or full)
		// are effects that happened: a copy of their message is a
		// duplicate whatever the set says. So are the ones written since
		// the read was sent.
		for _, pd := range slices.Concat(l.pending[d], l.landed[d]) {
			if !slices.Contains(ds, pd) {
				ds = append(ds, pd)
			}
		}
		l.days[d] = ds
	}
	for _, t := range ts {
		if _, ok := l.days[t.day]; !ok {
			// A lease believed held came back new (Redis lost it): the
			// days known went with it and are read now, under it.
			return false, errReadAgain
		}
	}
	u.markKnown(l, ts)
	return true, nil
}

// errReadAgain: the lease is held now, but days the tickets need are not
// known yet; ensure is called again at once.
var errReadAgain = errors.New("once: read the user's days again")

// heldLocked reports whether this process holds l by its own clock: taken
// or renewed within two thirds of a lease, so Redis cannot have given it to
// anyone else yet (u.mu held).
func (u *Users) heldLocked(l *userLease, now time.Time) bool {
	return l.value != "" && !l.lost && now.Sub(l.lastOK) < u.lease*2/3
}

// startableLocked reports whether work may start under l without asking
// Redis: held, and young enough that keep renews it in time. keep renews
// a lease with work at the first tick after renewAge; work started before
// renewAge plus a tick is renewed by half a lease at the latest, two ticks
// before the two thirds at which keep gives it up. An idle lease is not
// renewed (most users write seldom: renewing after each message would cost
// more calls than continuing the lease at the next one). An older lease
// would be given up before its first renewal could land, stopping the
// handler just started (after its effect, perhaps); it is taken again
// first, which continues it in one call (u.mu held).
func (u *Users) startableLocked(l *userLease, now time.Time) bool {
	return u.heldLocked(l, now) && now.Sub(l.lastOK) < u.renewAge()+u.tickEvery()
}

// renewAge is the age from which keep renews a lease with work: a third
// of a lease, which leaves a third for the renewal to land (four ticks).
func (u *Users) renewAge() time.Duration { return u.lease / 3 }

// tickEvery is keep's period.
func (u *Users) tickEvery() time.Duration { return max(u.lease/12, time.Millisecond) }

// markKnown sets each ticket's done flag from l's known digests and binds
// it to l's generation (u.mu held).
func (u *Users) markKnown(l *userLease, ts []*UserTicket) {
	for _, t := range ts {
		t.gen = l.gen
		t.done = slices.Contains(l.days[t.day], t.digest)
	}
}

func parseAcquire(v any) (code int64, value string, err error) {
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return 0, "", fmt.Errorf("once: unexpected lease answer %v", v)
	}
	code, _ = a[0].(int64)
	value, _ = a[1].(string)
	if code != 0 && !strings.Contains(value, ":") {
		return 0, "", fmt.Errorf("once: unexpected lease value %q", value)
	}
	return code, value, nil
}

// readLegacy looks the tickets not found done up in Client's per-message
// keys: a done marker makes them duplicates, a claim makes DoTicket wait.
func (u *Users) readLegacy(ctx context.Context, l *userLease, ts []*UserTicket) error {
	var keys []string
	var idx []int
	for i, t := range ts {
		if !t.done {
			keys = append(keys, u.legacyPrefix+t.key)
			idx = append(idx, i)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	args := make([]any, 0, len(keys)+1)
	args = append(args, "mget")
	for _, k := range keys {
		args = append(args, k)
	}
	res, err := u.b.do(ctx, nil, args)
	if err != nil {
		return fmt.Errorf("once: read per-message keys: %w", err)
	}
	vals, _ := res.([]any)
	for j, v := range vals {
		s, _ := v.(string)
		t := ts[idx[j]]
		t.legacyP = strings.HasPrefix(s, processingPrefix)
		if strings.HasPrefix(s, donePrefix) {
			t.done = true
		}
	}
	return nil
}

// Waiting reports the messages waiting on users leased by other owners
// (after a crash: the dead owner's users, until their leases expire).
func (u *Users) Waiting() Waits { return u.waits.snapshot(time.Now()) }

// DoTicket runs f for t's message unless it is done: the protocol of
// Client.DoTicket under the user's lease. f runs with the lease held; when
// the lease is lost while f runs, lost is called (once, from any goroutine)
// and the caller makes f return. On success the done mark is queued and
// DoTicket returns at once: marked is called when it was written (nil) or
// given up (an error). It may be called again for the same ticket after an
// error that is not f's.
func (u *Users) DoTicket(ctx context.Context, t *UserTicket, f func(ctx context.Context) error, marked, lost func(error)) (Status, error) {
	l := t.l
	if t.released {
		// Called again after an error of f's (the consumer retries a
		// handler stopped by a lost lease): the ticket takes its share
		// of the lease back and is looked at afresh.
		u.mu.Lock()
		l.busy++
		u.mu.Unlock()
		t.released = false
	}
	for {
		u.mu.Lock()
		fresh := t.err == nil && l.gen == t.gen && u.startableLocked(l, u.now())
		if fresh && !t.done {
			// Looked up again now: a copy of a message claimed in the
			// same window as the original was not done when claimed.
			t.done = slices.Contains(l.days[t.day], t.digest) || slices.Contains(l.pending[t.day], t.digest)
		}
		u.mu.Unlock()
		if fresh {
			break
		}
		// Not held (another owner, an error, or the lease was lost since
		// the claim): take it again, waiting for another owner.
		err := u.settle(ctx, l, []*UserTicket{t}, true)
		t.err = err
		if err != nil {
			u.m.errored.Inc()
			return StatusNone, err
		}
	}
	if !t.done && t.legacyP {
		done, err := u.waitLegacy(ctx, t.key)
		if err != nil {
			return StatusNone, err
		}
		t.done, t.legacyP = done, false
	}
	if t.done {
		u.m.duplicate.Inc()
		u.finishTicket(t)
		return StatusDuplicate, nil
	}
	u.mu.Lock()
	if l.running == nil {
		l.running = map[*UserTicket]func(error){}
	}
	l.running[t] = lost
	token, value := l.token, l.value
	u.mu.Unlock()
	err := f(context.WithValue(ctx, fencingKey{}, token))
	u.mu.Lock()
	delete(l.running, t)
	if err == nil {
		if ds, ok := l.days[t.day]; ok && !slices.Contains(ds, t.digest) {
			l.days[t.day] = append(ds, t.digest)
		}
		if l.pending == nil {
			l.pending = map[int64][]int64{}
		}
		l.pending[t.day] = append(l.pending[t.day], t.digest)
		// The ticket's share of busy passes to its mark.
		u.marks = append(u.marks, &pendingMark{l: l, value: value, day: t.day, digest: t.digest, key: t.key, marked: marked})
		t.released = true
		kick := u.flushing < maxFlushes
		if kick {
			u.flushing++
		}
		u.mu.Unlock()
		u.m.executed.Inc()
		if kick {
			go u.flush()
		}
		return StatusExecuted, nil
	}
	u.mu.Unlock()
	u.m.failed.Inc()
	u.finishTicket(t)
	return StatusExecuted, err
}

// waitLegacy polls a per-message key of the previous store until it is no
// longer a claim; it reports whether it became done.
func (u *Users) waitLegacy(ctx context.Context, key string) (bool, error) {
	for {
		v, err := u.b.do(ctx, nil, []any{"get", u.legacyPrefix + key})
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, fmt.Errorf("once: read per-message key: %w", err)
		}
		s, _ := v.(string)
		if !strings.HasPrefix(s, processingPrefix) {
			return strings.HasPrefix(s, donePrefix), nil
		}
		t := time.NewTimer(u.poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// finishTicket ends t's share of its lease.
func (u *Users) finishTicket(t *UserTicket) {
	if t.released {
		return
	}
	t.released = true
	u.mu.Lock()
	t.l.busy--
	u.mu.Unlock()
}

// Release gives back tickets that will not be run.
func (u *Users) Release(ts ...*UserTicket) {
	for _, t := range ts {
		u.finishTicket(t)
	}
}

// ReleaseIdle gives back every lease that has no work (after a rebalance:
// the users of revoked partitions are someone else's now, and a lease left
// to expire would hold their new owner up for a lease). A busy lease is
// given back when its work is done.
func (u *Users) ReleaseIdle() {
	u.mu.Lock()
	for _, l := range u.leases {
		l.release = true
	}
	u.mu.Unlock()
	u.sweep(context.Background())
}
