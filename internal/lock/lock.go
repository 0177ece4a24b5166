// Package lock gives one holder at a time per name across processes: a
// redsync mutex on the shared Redis (a single node or Sentinel — never
// Cluster), extended automatically while held, with a fenced write that only
// lands while the lock is still ours (the sync cursor, I1).
package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Errors returned by this package.
var (
	// ErrBusy is returned by TryLock when someone else holds the lock.
	ErrBusy = errors.New("lock: busy")
	// ErrNotHeld is returned by SetIfHeld, Extend and Unlock when the lock
	// is no longer ours (it expired, was taken over, or was unlocked).
	ErrNotHeld = errors.New("lock: not held")
)

// minTTL keeps the extension interval (ttl/3) and redsync's acquire timeout
// (5% of ttl) meaningful.
const minTTL = 30 * time.Millisecond

// Locker hands out mutexes whose Redis key is its prefix plus the name.
type Locker struct {
	rdb        redis.UniversalClient
	rs         *redsync.Redsync
	prefix     string
	autoExtend bool
	retryDelay time.Duration
	log        *zap.Logger

	lost     prometheus.Counter
	acquired prometheus.Counter
	busy     prometheus.Counter
}

type options struct {
	autoExtend bool
	retryDelay time.Duration
	log        *zap.Logger
	reg        prometheus.Registerer
}

// Option changes how New builds a Locker.
type Option func(*options)

// WithAutoExtend turns the automatic extension of held locks on (the
// default) or off; without it the holder calls Mutex.Extend itself.
func WithAutoExtend(on bool) Option { return func(o *options) { o.autoExtend = on } }

// WithRetryDelay sets the pause between Lock's attempts (default 50ms, with
// up to 50% jitter so waiters do not retry in lockstep).
func WithRetryDelay(d time.Duration) Option { return func(o *options) { o.retryDelay = d } }

// WithLogger sets the logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithRegisterer registers the locker's metrics (default: not registered).
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.reg = r } }

// New returns a Locker on client. Mutex keys are prefix + name.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Locker {
	o := options{autoExtend: true, retryDelay: 50 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	if o.retryDelay <= 0 {
		o.retryDelay = 50 * time.Millisecond
	}
	lost := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_lock_lost_total",
		Help: "Locks lost while held (extension or fenced write found another value).",
	})
	acq := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_lock_attempts_total",
		Help: "Lock attempts by result (acquired, busy).",
	}, []string{"result"})
	if o.reg != nil {
		o.reg.MustRegister(lost, acq)
	}
	return &Locker{
		rdb:        client,
		rs:         redsync.New(goredis.NewPool(client)),
		prefix:     prefix,
		autoExtend: o.autoExtend,
		retryDelay: o.retryDelay,
		log:        o.log,
		lost:       lost,
		acquired:   acq.WithLabelValues("acquired"),
		busy:       acq.WithLabelValues("busy"),
	}
}

// TryLock takes the lock name for ttl if it is free, else returns ErrBusy
// at once.
func (l *Locker) TryLock(ctx context.Context, name string, ttl time.Duration) (*Mutex, error) {
	if ttl < minTTL {
		return nil, fmt.Errorf("lock %s: ttl %v is smaller than allowed %v", name, ttl, minTTL)
	}
	rm := l.rs.NewMutex(l.prefix+name, redsync.WithExpiry(ttl), redsync.WithTries(1))
	if err := rm.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
			// ErrFailed with one try: acquired too slowly to be valid, and
			// released again; to the caller that is a busy lock.
			l.busy.Inc()
			return nil, fmt.Errorf("lock %s: %w", name, ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	l.acquired.Inc()
	m := &Mutex{
		l: l, rm: rm, name: name, key: rm.Name(), value: rm.Value(), ttl: ttl,
		lost: make(chan struct{}),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if l.autoExtend {
		go m.extendLoop()
	} else {
		close(m.done)
	}
	return m, nil
}

// Remaining returns how long the lock name has left before it expires
// unless its holder extends it: 0 when nobody holds it. A process that
// found the lock busy can try again then, whether the holder is alive or
// was killed holding it.
func (l *Locker) Remaining(ctx context.Context, name string) (time.Duration, error) {
	d, err := l.rdb.PTTL(ctx, l.prefix+name).Result()
	if err != nil {
		return 0, fmt.Errorf("lock %s: ttl: %w", name, err)
	}
	return max(d, 0), nil // -2: no key; -1 (no expiry) does not happen to a lock
}

// Lock takes the lock name for ttl, retrying while it is busy (or Redis
// fails) until ctx ends.
func (l *Locker) Lock(ctx context.Context, name string, ttl time.Duration) (*Mutex, error) {
	var timer *time.Timer
	for {
		m, err := l.TryLock(ctx, name, ttl)
		if err == nil {
			return m, nil
		}
		if ttl < minTTL {
			return nil, err
		}
		d := l.retryDelay + rand.N(l.retryDelay/2+1)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock %s: %w (last attempt: %v)", name, ctx.Err(), err)
		case <-timer.C:
		}
	}
}

// Mutex is a held lock. Its methods are safe for concurrent use.
type Mutex struct {
	l     *Locker
	rm    *redsync.Mutex // used by one goroutine at a time: the extender, then Unlock
	name  string
	key   string
	value string
	ttl   time.Duration

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{} // closed by Unlock
	done     chan struct{} // closed when the extender has exited

	mu       sync.Mutex // serialises Extend, Unlock and the extender's calls into rm
	unlocked bool
}

// Name returns the name the lock was taken with (without the prefix).
func (m *Mutex) Name() string { return m.name }

// Key returns the lock's Redis key.
func (m *Mutex) Key() string { return m.key }

// Value returns the random value that marks the lock as ours in Redis.
func (m *Mutex) Value() string { return m.value }

// Lost is closed when the lock is found to be no longer ours while held: an
// extension or a fenced write saw another value (or none), or extensions
// kept failing until the TTL passed. The holder should stop its work. It is
// not closed by Unlock.
func (m *Mutex) Lost() <-chan struct{} { return m.lost }

func (m *Mutex) markLost(why string) {
	m.lostOnce.Do(func() {
		m.l.lost.Inc()
		m.l.log.Warn("lock lost", zap.String("lock", m.key), zap.String("why", why))
		close(m.lost)
	})
}

func (m *Mutex) extendLoop() {
	defer close(m.done)
	interval := m.ttl / 3
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		next := interval
		if err := m.extend(context.Background(), interval); err != nil {
			if errors.Is(err, ErrNotHeld) {
				return
			}
			// Transient (timeout, connection): try again well before the
			// lock can expire instead of waiting a whole interval.
			next = interval / 4
			m.l.log.Warn("lock extend", zap.String("lock", m.key), zap.Error(err))
		}
		t.Reset(next)
	}
}

// Extend pushes the lock's expiry out to a full ttl from now. The
// extender calls it every ttl/3; call it yourself when auto-extension is
// off.
func (m *Mutex) Extend(ctx context.Context) error {
	return m.extend(ctx, m.ttl/3)
}

func (m *Mutex) extend(ctx context.Context, timeout time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unlocked {
		return ErrNotHeld
	}
	select {
	case <-m.lost:
		return ErrNotHeld
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ok, err := m.rm.ExtendContext(ctx)
	if ok {
		return nil
	}
	var taken *redsync.ErrTaken
	if errors.As(err, &taken) || errors.Is(err, redsync.ErrExtendFailed) {
		m.markLost("extend: key holds another value or none")
		return fmt.Errorf("lock %s: %w", m.name, ErrNotHeld)
	}
	if !time.Now().Before(m.rm.Until()) {
		// Redis has been unreachable for longer than the lock lives: it has
		// expired there, whoever holds it now.
		m.markLost("extend: failing past the lock's validity")
		return fmt.Errorf("lock %s: %w (last error: %v)", m.name, ErrNotHeld, err)
	}
	return fmt.Errorf("lock %s: extend: %w", m.name, err)
}

// setIfHeld writes KEYS[2] only while KEYS[1] (the lock) holds our value.
var setIfHeld = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
`)

// SetIfHeld sets prefix+key to value (with ttl, 0 = no expiry) in the same
// atomic step that checks the lock is still ours, so a holder that lost the
// lock without noticing can never overwrite its successor's write. It
// returns ErrNotHeld (and closes Lost) when the lock is not ours.
func (m *Mutex) SetIfHeld(ctx context.Context, key, value string, ttl time.Duration) error {
	n, err := setIfHeld.Run(ctx, m.l.rdb, []string{m.key, m.l.prefix + key}, m.value, value, ttl.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("lock %s: set %s: %w", m.name, key, err)
	}
	if n != 1 {
		m.markLost("fenced write: key holds another value or none")
		return fmt.Errorf("lock %s: set %s: %w", m.name, key, ErrNotHeld)
	}
	return nil
}

// Unlock stops the extender, waits for it, and releases the lock. It
// returns ErrNotHeld when the lock was no longer ours (or already
// unlocked); either way the Mutex is done.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	if m.unlocked {
		m.mu.Unlock()
		return fmt.Errorf("lock %s: %w", m.name, ErrNotHeld)
	}
	m.unlocked = true
	close(m.stop)
	m.mu.Unlock()
	<-m.done

	ok, err := m.rm.UnlockContext(ctx)
	if ok {
		return nil
	}
	var taken *redsync.ErrTaken
	if errors.As(err, &taken) || errors.Is(err, redsync.ErrLockAlreadyExpired) {
		return fmt.Errorf("lock %s: %w", m.name, ErrNotHeld)
	}
	return fmt.Errorf("lock %s: unlock: %w", m.name, err)
}
