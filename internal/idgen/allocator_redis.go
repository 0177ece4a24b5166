package idgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// claimScript takes KEYS[1] for owner ARGV[1] for ARGV[2] ms. A key we
// already own counts as claimed (and is refreshed), so retrying a claim
// whose reply was lost does not skip an ID we actually hold.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)

// renewScript extends KEYS[1] only while ARGV[1] owns it. Returns {1} when
// renewed, {0} when the key is gone, {-1, owner} when someone else owns it:
// a plain EXPIRE would silently extend another holder's claim.
var renewScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
if not v then return {0} end
return {-1, v}`)

// releaseScript deletes KEYS[1] only while ARGV[1] owns it; returns 1 if
// deleted, 0 if gone, -1 if owned by someone else.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if not v then return 0 end
return -1`)

// RedisAllocator is the Redis backend of Allocator: one key per worker ID,
// claimed with SET NX PX and renewed with an owner check.
type RedisAllocator struct {
	client redis.UniversalClient
	cfg    AllocatorConfig
	log    *zap.Logger
	m      *metrics

	mu      sync.Mutex
	id      int    // valid when key != ""
	key     string // the claimed key, "" when none
	stopped bool
	kaStop  context.CancelFunc
	kaDone  chan struct{}
}

var _ Allocator = (*RedisAllocator)(nil)

// NewRedisAllocator returns a Redis-backed Allocator. Options: WithLogger,
// WithRegisterer.
func NewRedisAllocator(client redis.UniversalClient, cfg AllocatorConfig, opts ...Option) (*RedisAllocator, error) {
	if client == nil {
		return nil, errors.New("idgen: redis allocator needs a client")
	}
	cfg.setDefaults()
	o := buildOptions(opts)
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	return &RedisAllocator{client: client, cfg: cfg, log: o.logger, m: m}, nil
}

func (a *RedisAllocator) keyOf(id int) string {
	return a.cfg.Prefix + "idgen:worker:" + strconv.Itoa(id)
}

// Allocate claims a free worker ID, scanning the pool as a ring from a
// random start. A second call returns the ID already held.
func (a *RedisAllocator) Allocate(ctx context.Context) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return 0, ErrStopped
	}
	if a.key != "" {
		return a.id, nil
	}
	ttl := a.cfg.TTL.Milliseconds()
	start := randomOffset(a.cfg.MaxID)
	for i := range a.cfg.MaxID {
		id := (start + i) % a.cfg.MaxID
		key := a.keyOf(id)
		ok, err := claimScript.Run(ctx, a.client, []string{key}, a.cfg.Owner, ttl).Int()
		if err != nil {
			a.m.errors.WithLabelValues(reasonRedis).Inc()
			return 0, fmt.Errorf("idgen: claim worker id %d: %w", id, err)
		}
		if ok == 1 {
			a.id, a.key = id, key
			a.log.Info("worker id allocated", zap.Int("worker_id", id), zap.String("key", key), zap.String("owner", a.cfg.Owner))
			return id, nil
		}
	}
	return 0, noFreeID(a.cfg.MaxID, a.cfg.Prefix+"idgen:worker:")
}

// ID returns the held worker ID, if any.
func (a *RedisAllocator) ID() (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id, a.key != ""
}

// KeepAlive renews the claim every TTL/3 until ctx is done or Stop. Failed
// renewals are reported without blocking and retried; once no renewal has
// succeeded for a whole TTL, or the key is gone or owned by someone else,
// ErrLeaseExpired or ErrKeyStolen is sent and the channel closed.
func (a *RedisAllocator) KeepAlive(ctx context.Context) <-chan error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopped:
		return closedErr(ErrStopped)
	case a.key == "":
		return closedErr(ErrNotAllocated)
	case a.kaDone != nil:
		return closedErr(errors.New("idgen: keepalive already running"))
	}
	// One slot: fatal errors are sent blocking, transient ones dropped when
	// the slot is full (see sendTransient).
	errc := make(chan error, 1)
	kctx, cancel := context.WithCancel(ctx)
	a.kaStop, a.kaDone = cancel, make(chan struct{})
	go a.keepAlive(kctx, a.id, a.key, errc, a.kaDone)
	return errc
}

func (a *RedisAllocator) keepAlive(ctx context.Context, id int, key string, errc chan<- error, done chan<- struct{}) {
	defer close(done)
	defer close(errc)
	interval := max(a.cfg.TTL/3, time.Millisecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	lastOK := time.Now()
	ttl := a.cfg.TTL.Milliseconds()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		res, err := renewScript.Run(rctx, a.client, []string{key}, a.cfg.Owner, ttl).Slice()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if time.Since(lastOK) >= a.cfg.TTL {
				a.m.errors.WithLabelValues(reasonLeaseExpired).Inc()
				sendFatal(ctx, errc, fmt.Errorf("%w: worker id %d not renewed for %s: %v", ErrLeaseExpired, id, a.cfg.TTL, err))
				return
			}
			a.m.errors.WithLabelValues(reasonRenew).Inc()
			sendTransient(errc, fmt.Errorf("idgen: renew worker id %d: %w", id, err))
			continue
		}
		switch code, _ := res[0].(int64); code {
		case 1:
			lastOK = time.Now()
		case 0:
			a.m.errors.WithLabelValues(reasonLeaseExpired).Inc()
			sendFatal(ctx, errc, fmt.Errorf("%w: key %s of worker id %d is gone", ErrLeaseExpired, key, id))
			return
		default:
			a.m.errors.WithLabelValues(reasonKeyStolen).Inc()
			sendFatal(ctx, errc, fmt.Errorf("%w: key %s of worker id %d is held by %v", ErrKeyStolen, key, id, res[1]))
			return
		}
	}
}

// Stop ends KeepAlive, waits for it, and deletes the key if it is still
// ours. It returns ErrKeyStolen if someone else holds the key by now.
// Calling Stop again does nothing.
func (a *RedisAllocator) Stop(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return nil
	}
	a.stopped = true
	if a.kaStop != nil {
		a.kaStop()
		<-a.kaDone
	}
	if a.key == "" {
		return nil
	}
	key, id := a.key, a.id
	a.key = ""
	res, err := releaseScript.Run(ctx, a.client, []string{key}, a.cfg.Owner).Int()
	switch {
	case err != nil:
		a.m.errors.WithLabelValues(reasonRedis).Inc()
		return fmt.Errorf("idgen: release worker id %d: %w", id, err)
	case res < 0:
		return fmt.Errorf("%w: key %s of worker id %d was not ours at Stop", ErrKeyStolen, key, id)
	}
	a.log.Info("worker id released", zap.Int("worker_id", id), zap.Bool("was_present", res == 1))
	return nil
}
