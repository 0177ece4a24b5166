package once

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// ErrFenced is what a done mark's marked callback gets when Redis refused
// the mark because another owner holds the user's lease.
var ErrFenced = errors.New("once: done mark refused: another owner holds the user's lease")

type fencingKey struct{}

// FencingTokenFrom returns the lease token a handler runs under (Users):
// it grows with every new lease of the user, so a downstream system that
// remembers the largest token it saw per user can refuse writes from an
// owner that lost the user meanwhile (a paused process).
func FencingTokenFrom(ctx context.Context) (int64, bool) {
	t, ok := ctx.Value(fencingKey{}).(int64)
	return t, ok
}

// keep renews the leases that have work, gives up the ones it cannot renew
// and forgets or releases the idle ones; one tick every twelfth of a lease,
// as Client's keeper.
func (u *Users) keep() {
	defer u.wg.Done()
	tk := time.NewTicker(u.tickEvery())
	defer tk.Stop()
	for {
		select {
		case <-u.stop:
			return
		case <-tk.C:
			u.tick()
		}
	}
}

func (u *Users) tick() {
	now := u.now()
	var renew []*userLease
	var values []string
	var told []func(error)
	u.mu.Lock()
	for user, l := range u.leases {
		if l.releasing {
			continue // sweep ends it
		}
		age := now.Sub(l.lastOK)
		busy := l.busy > 0 || len(l.running) > 0
		switch {
		case l.value == "" || l.lost:
			if !busy {
				delete(u.leases, user)
			}
		case busy && age >= u.lease*2/3:
			told = append(told, u.loseLocked(l)...)
		case busy && age >= u.renewAge() && !l.renew:
			l.renew = true
			renew = append(renew, l)
			values = append(values, l.value)
		case !busy && age >= u.lease:
			// Idle, and expired in Redis by now: Redis lets it go.
			// Until then the entry stays, untrusted after two thirds:
			// the user's next message continues the lease in one call
			// and, when Redis answers that it is still this process's
			// (nobody held it since), keeps the days it knows instead
			// of reading them again.
			delete(u.leases, user)
		}
	}
	u.mu.Unlock()
	for _, f := range told {
		f(errLeaseLost)
	}
	if len(renew) > 0 {
		go u.renewAll(renew, values, now)
	}
	u.sweep(context.Background())
	// Messages waiting on a user another owner leases (after a crash, the
	// dead owner's lease until it expires) are logged as store claims'
	// waits are.
	if reportWaits(u.log, &u.lastWarn, u.waits.snapshot(now), now, u.lease) {
		u.lastWarn = now
	}
}

// errLeaseLost is what a running handler's lost callback gets.
var errLeaseLost = errors.New("once: user lease lost (not renewed for two thirds of it, or taken over)")

// loseLocked gives l up (u.mu held) and returns its running handlers' lost
// callbacks, to be called without the lock.
func (u *Users) loseLocked(l *userLease) []func(error) {
	if l.lost {
		return nil
	}
	l.lost = true
	l.gen++
	l.days, l.expSet = nil, nil
	u.m.lost.Inc()
	u.log.Warn("once: user lease given up", zap.String("user", l.user), zap.Duration("since_renewal", u.now().Sub(l.lastOK)))
	var fs []func(error)
	for t, f := range l.running {
		if f != nil {
			fs = append(fs, f)
		}
		delete(l.running, t)
	}
	return fs
}

// renewAll renews ls (their values as sent) in script calls of at most
// maxMarksPerFlush leases.
func (u *Users) renewAll(ls []*userLease, values []string, sent time.Time) {
	for lo := 0; lo < len(ls); lo += maxMarksPerFlush {
		hi := min(lo+maxMarksPerFlush, len(ls))
		keys := make([]string, hi-lo)
		args := make([]any, 0, hi-lo+1)
		args = append(args, u.leaseMs)
		for i, l := range ls[lo:hi] {
			keys[i] = l.key
			args = append(args, values[lo+i])
		}
		ctx, cancel := context.WithTimeout(context.Background(), u.opTimeout)
		res, err := leaseRenewScript.Run(ctx, u.rdb, keys, args...).Slice()
		cancel()
		var told []func(error)
		u.mu.Lock()
		for i, l := range ls[lo:hi] {
			l.renew = false
			if err != nil || l.value != values[lo+i] || l.lost {
				continue // failed: retried next tick, given up at two thirds
			}
			if n, _ := res[i].(int64); n == 1 {
				l.lastOK = sent
			} else {
				told = append(told, u.loseLocked(l)...)
			}
		}
		u.mu.Unlock()
		for _, f := range told {
			f(errLeaseLost)
		}
		if err != nil {
			u.log.Warn("once: renewing user leases failed", zap.Int("leases", hi-lo), zap.Error(err))
		}
	}
}

// sweep gives back the leases marked for release that have no work.
func (u *Users) sweep(ctx context.Context) {
	var ls []*userLease
	var keys []string
	var values []any
	u.mu.Lock()
	for user, l := range u.leases {
		if !l.release || l.releasing || l.busy > 0 || len(l.running) > 0 {
			continue
		}
		if l.value == "" || l.lost {
			delete(u.leases, user)
			continue
		}
		// It stays in the map, marked, until Redis has answered: a new
		// message of the user waits for the release instead of taking
		// the lease again under the same value, which the release would
		// then delete from under it.
		l.releasing = true
		ls = append(ls, l)
		keys = append(keys, l.key)
		values = append(values, l.value)
	}
	u.mu.Unlock()
	for lo := 0; lo < len(keys); lo += maxMarksPerFlush {
		hi := min(lo+maxMarksPerFlush, len(keys))
		cctx, cancel := context.WithTimeout(ctx, u.opTimeout)
		err := leaseReleaseScript.Run(cctx, u.rdb, keys[lo:hi], values[lo:hi]...).Err()
		cancel()
		if err != nil {
			// They expire within a lease anyway.
			u.log.Warn("once: releasing user leases failed", zap.Int("leases", hi-lo), zap.Error(err))
		} else {
			u.m.released.Add(float64(hi - lo))
		}
		u.mu.Lock()
		for _, l := range ls[lo:hi] {
			l.releasing, l.release = false, false
			l.value, l.days, l.expSet = "", nil, nil
			l.gen++
			if l.busy == 0 && len(l.running) == 0 && u.leases[l.user] == l {
				delete(u.leases, l.user)
			}
		}
		u.mu.Unlock()
	}
}

type markGroup struct {
	l     *userLease
	value string
	day   int64
	exp   int64
	marks []*pendingMark
	// trusted: the lease the marks were made under is still this
	// process's by its own clock (renewed within two thirds of a lease),
	// so Redis cannot have given it to anyone else yet: the marks go as
	// plain SADDs. Otherwise they go through markScript, which refuses
	// them when another owner holds the lease.
	trusted bool
}

// flush writes the queued done marks, a script call (and pipeline) at a
// time, until none is left; at most maxFlushes run at once.
func (u *Users) flush() {
	backoff := u.poll
	for {
		u.mu.Lock()
		if len(u.marks) == 0 {
			u.flushing--
			u.mu.Unlock()
			return
		}
		n := min(len(u.marks), maxMarksPerFlush)
		batch := u.marks[:n:n]
		u.marks = u.marks[n:]
		if len(u.marks) == 0 {
			u.marks = nil
		}
		now := u.now()
		floor := now.Add(u.ttl).UnixMilli()
		// Group by lease and day: one SADD per group.
		var groups []*markGroup
		index := map[markGroupKey]*markGroup{}
		for _, m := range batch {
			k := markGroupKey{m.l, m.day}
			g := index[k]
			if g == nil {
				// A mark is this process's true effect whichever of its
				// values it was made under: while the lease is ours now, it
				// goes plain; else the script compares the value this
				// process last held, refusing it only under another owner.
				l := m.l
				value := m.value
				if l.value != "" {
					value = l.value
				}
				g = &markGroup{l: l, value: value, day: m.day,
					trusted: u.heldLocked(l, now)}
				// The set must outlive every mark in it by the TTL: its
				// expiry is pushed out when it falls short, with an hour to
				// spare so that a busy user's set is not touched every time.
				if m.l.expSet[m.day] < floor {
					g.exp = floor + time.Hour.Milliseconds()
				}
				index[k] = g
				groups = append(groups, g)
			}
			g.marks = append(g.marks, m)
		}
		u.mu.Unlock()

		err := u.sendMarks(groups)
		if err != nil {
			u.log.Warn("once: writing done marks failed; retrying", zap.Int("marks", len(batch)), zap.Error(err))
			u.mu.Lock()
			closed := u.closed
			if !closed {
				u.marks = append(batch, u.marks...)
			}
			u.mu.Unlock()
			if closed {
				u.endMarks(batch, err)
				continue
			}
			select {
			case <-time.After(backoff):
			case <-u.stop:
			}
			backoff = min(2*backoff, u.lease/4)
			continue
		}
		backoff = u.poll
	}
}

type markGroupKey struct {
	l   *userLease
	day int64
}

// sendMarks sends one mark script for groups (plus, with LegacyReadWrite,
// the per-message done markers) and settles each group's marks.
func (u *Users) sendMarks(groups []*markGroup) error {
	var cmds [][]any
	var scripts []*redis.Script
	var fenced []*markGroup
	var keys, argv []any
	for _, g := range groups {
		if g.trusted {
			cmd := make([]any, 0, 2+len(g.marks))
			cmd = append(cmd, "sadd", u.doneKey(g.l.user, g.day))
			for _, m := range g.marks {
				cmd = append(cmd, m.digest)
			}
			cmds, scripts = append(cmds, cmd), append(scripts, nil)
			if g.exp > 0 {
				cmds, scripts = append(cmds, []any{"pexpireat", u.doneKey(g.l.user, g.day), g.exp}), append(scripts, nil)
			}
			continue
		}
		fenced = append(fenced, g)
		keys = append(keys, g.l.key, u.doneKey(g.l.user, g.day))
		argv = append(argv, g.value, g.exp, len(g.marks))
		for _, m := range g.marks {
			argv = append(argv, m.digest)
		}
	}
	script := -1
	if len(fenced) > 0 {
		cmd := make([]any, 0, 3+len(keys)+len(argv))
		cmd = append(cmd, "evalsha", markScript.Hash(), len(keys))
		cmd = append(cmd, keys...)
		cmd = append(cmd, argv...)
		script = len(cmds)
		cmds, scripts = append(cmds, cmd), append(scripts, markScript)
	}
	if u.legacy == LegacyReadWrite {
		ttlMs := u.ttl.Milliseconds()
		for _, g := range groups {
			for _, m := range g.marks {
				cmds, scripts = append(cmds, []any{"set", u.legacyPrefix + m.key, donePrefix, "px", ttlMs}), append(scripts, nil)
			}
		}
	}
	res := make([]any, len(cmds))
	errs := make([]error, len(cmds))
	u.b.doAll(context.Background(), scripts, cmds, res, errs)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	refused := map[*markGroup]bool{}
	if script >= 0 {
		codes, _ := res[script].([]any)
		if len(codes) != len(fenced) {
			return errors.New("once: unexpected answer to the mark script")
		}
		for i, g := range fenced {
			if code, _ := codes[i].(int64); code == 0 {
				refused[g] = true
			}
		}
	}
	for _, g := range groups {
		var err error
		if refused[g] {
			err = ErrFenced
			u.m.refused.Add(float64(len(g.marks)))
			u.log.Warn("once: done marks refused: another owner holds the user's lease", zap.String("user", g.l.user),
				zap.Int("marks", len(g.marks)))
		} else if g.exp > 0 {
			u.mu.Lock()
			if g.l.expSet == nil {
				g.l.expSet = map[int64]int64{}
			}
			g.l.expSet[g.day] = max(g.l.expSet[g.day], g.exp)
			u.mu.Unlock()
		}
		u.endMarks(g.marks, err)
	}
	u.m.marks.Add(float64(len(groups)))
	return nil
}

// endMarks tells the marks' callers and releases their share of the lease.
func (u *Users) endMarks(ms []*pendingMark, err error) {
	u.mu.Lock()
	for _, m := range ms {
		m.l.busy--
		if ds := m.l.pending[m.day]; len(ds) > 0 {
			if i := slices.Index(ds, m.digest); i >= 0 {
				ds = slices.Delete(ds, i, i+1)
			}
			if len(ds) == 0 {
				delete(m.l.pending, m.day)
			} else {
				m.l.pending[m.day] = ds
			}
		}
		if err == nil && m.l.reads > 0 {
			// A read in flight may have missed it: keep it known.
			if m.l.landed == nil {
				m.l.landed = map[int64][]int64{}
			}
			m.l.landed[m.day] = append(m.l.landed[m.day], m.digest)
		}
	}
	u.mu.Unlock()
	for _, m := range ms {
		if m.marked != nil {
			m.marked(err)
		}
	}
}

// Close writes the queued done marks (bounded by ctx), gives back the idle
// leases and stops the store's goroutines.
func (u *Users) Close(ctx context.Context) error {
	var err error
	u.once.Do(func() {
		for {
			u.mu.Lock()
			pending := len(u.marks) > 0 || u.flushing > 0
			u.mu.Unlock()
			if !pending || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		u.mu.Lock()
		u.closed = true
		left := u.marks
		u.marks = nil
		for _, l := range u.leases {
			l.release = true
		}
		u.mu.Unlock()
		close(u.stop)
		u.wg.Wait()
		if len(left) > 0 {
			err = errors.New("once: done marks not written at close")
			u.endMarks(left, ErrClosed)
		}
		u.sweep(context.Background())
		u.b.close()
	})
	return err
}

type usersMetrics struct {
	executed, failed, duplicate, errored prometheus.Counter
	waits, lost, refused, marks          prometheus.Counter
	acquired, continued, released        prometheus.Counter
	batchOps                             prometheus.Observer
}

func newUsersMetrics(service string, reg prometheus.Registerer) *usersMetrics {
	labels := prometheus.Labels{"service": service}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_dedup_calls_total", ConstLabels: labels,
		Help: "Messages run under a user's lease by result: executed (handler succeeded), failed, duplicate (found in the user's done marks), error (Redis or context).",
	}, []string{"result"})
	leases := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_dedup_leases_total", ConstLabels: labels,
		Help: "User leases by event: acquired (new token), continued (our lapsed lease taken again, no one held it since), lost (given up or taken over while busy), released.",
	}, []string{"event"})
	waits := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_dedup_lease_waits_total", ConstLabels: labels,
		Help: "Messages that found their user leased by another owner and waited.",
	})
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_dedup_marks_refused_total", ConstLabels: labels,
		Help: "Done marks Redis refused because another owner held the user's lease (this owner had lost it).",
	})
	marks := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_dedup_mark_groups_total", ConstLabels: labels,
		Help: "Groups of done marks written (one SADD each: a user's day).",
	})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kfpipe_dedup_batch_ops", ConstLabels: labels,
		Help:    "Operations per Redis pipeline sent for user leases and checks.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	if reg != nil {
		reg.MustRegister(calls, leases, waits, refused, marks, batch)
	}
	return &usersMetrics{
		executed: calls.WithLabelValues("executed"), failed: calls.WithLabelValues("failed"),
		duplicate: calls.WithLabelValues("duplicate"), errored: calls.WithLabelValues("error"),
		waits: waits, lost: leases.WithLabelValues("lost"), refused: refused, marks: marks,
		acquired: leases.WithLabelValues("acquired"), continued: leases.WithLabelValues("continued"),
		released: leases.WithLabelValues("released"), batchOps: batch,
	}
}
