package idgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
)

// incrScript adds ARGV[1] to KEYS[1]; past a max ARGV[2] > 0 the sequence
// restarts so that it returns ARGV[1]; a TTL ARGV[3] > 0 ms is refreshed.
// One script so concurrent callers can never see the same value or a
// half-applied wrap.
var incrScript = redis.NewScript(`
local max = tonumber(ARGV[2])
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if max > 0 and v > max then
  redis.call('SET', KEYS[1], ARGV[1])
  v = tonumber(ARGV[1])
end
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return v`)

// setScript sets KEYS[1] to ARGV[1] (only if absent when ARGV[3] == "nx")
// with the TTL ARGV[2] > 0 ms. Returns 1 if written.
var setScript = redis.NewScript(`
local ok
if ARGV[3] == 'nx' then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX')
else
  ok = redis.call('SET', KEYS[1], ARGV[1])
end
if not ok then return 0 end
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1`)

// maxExactValue bounds MaxValue and Set: Redis Lua numbers are doubles,
// exact only up to 2^53.
const maxExactValue = config.MaxSequenceValue

// MaxBatch bounds NextBatch's n, and so the slice it allocates.
const MaxBatch = 1 << 20

// SequencerConfig configures a Sequencer: idgen.sequencer
// (SequencerFromConfig), which internal/config checked when it loaded.
type SequencerConfig struct {
	// Driver is "redis" (empty means redis), the one backend.
	Driver string
	// Prefix starts every key: Prefix+"seq:"+key.
	Prefix string
	// Step is added per value (default 1).
	Step int64
	// MaxValue > 0 makes the sequence wrap back to Step once it would pass
	// MaxValue; values are then no longer increasing. 0 = no wrap.
	MaxValue int64
	// TTL > 0 expires an idle sequence; every Next/NextBatch/Set refreshes it.
	TTL time.Duration
}

func (c *SequencerConfig) setDefaults() {
	if c.Driver == "" {
		c.Driver = "redis"
	}
	if c.Step == 0 {
		c.Step = 1
	}
}

// Sequencer hands out increasing values per key from Redis; different keys
// are independent. Safe for concurrent use by any number of processes.
type Sequencer struct {
	client redis.UniversalClient
	cfg    SequencerConfig
	m      *metrics
}

// NewSequencer returns a Sequencer. Options: WithRegisterer.
func NewSequencer(client redis.UniversalClient, cfg SequencerConfig, opts ...Option) (*Sequencer, error) {
	cfg.setDefaults()
	if client == nil {
		return nil, errors.New("idgen: sequencer needs a redis client")
	}
	o := buildOptions(opts)
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	return &Sequencer{client: client, cfg: cfg, m: m}, nil
}

func (s *Sequencer) redisKey(key string) (string, error) {
	if key == "" {
		return "", errors.New("idgen: sequence key must not be empty")
	}
	return s.cfg.Prefix + "seq:" + key, nil
}

// Next returns the key's next value: the previous one plus Step (Step for a
// new key, or after a wrap at MaxValue).
func (s *Sequencer) Next(ctx context.Context, key string) (int64, error) {
	return s.incr(ctx, key, 1)
}

// NextBatch reserves n consecutive values in one round trip and returns
// them in order, e.g. Step 5, n 3 on a new key: [5 10 15]. With MaxValue, a
// batch that would cross it restarts at Step as a whole (the values between
// the old position and MaxValue are skipped), so n*Step must not exceed
// MaxValue.
func (s *Sequencer) NextBatch(ctx context.Context, key string, n int) ([]int64, error) {
	if n < 1 || n > MaxBatch {
		return nil, fmt.Errorf("idgen: batch size must be in [1, %d], got %d", MaxBatch, n)
	}
	last, err := s.incr(ctx, key, n)
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = last - int64(n-1-i)*s.cfg.Step
	}
	return out, nil
}

// incr adds n*Step and returns the last value reserved.
func (s *Sequencer) incr(ctx context.Context, key string, n int) (int64, error) {
	rk, err := s.redisKey(key)
	if err != nil {
		return 0, err
	}
	if s.cfg.Step > math.MaxInt64/int64(n) {
		return 0, fmt.Errorf("idgen: batch of %d with step %d overflows int64", n, s.cfg.Step)
	}
	delta := s.cfg.Step * int64(n)
	if s.cfg.MaxValue > 0 && delta > s.cfg.MaxValue {
		return 0, fmt.Errorf("idgen: batch of %d with step %d exceeds idgen.sequencer.max_value %d", n, s.cfg.Step, s.cfg.MaxValue)
	}
	v, err := incrScript.Run(ctx, s.client, []string{rk}, delta, s.cfg.MaxValue, s.cfg.TTL.Milliseconds()).Int64()
	if err != nil {
		s.m.errors.WithLabelValues(reasonRedis).Inc()
		return 0, fmt.Errorf("idgen: next sequence %q: %w", key, err)
	}
	s.m.sequences.Add(float64(n))
	return v, nil
}

// Set makes v the key's current value (the next Next returns v+Step).
// It overwrites whatever is there; prefer SetIfNotExists for baselines.
func (s *Sequencer) Set(ctx context.Context, key string, v int64) error {
	_, err := s.set(ctx, key, v, "")
	return err
}

// SetIfNotExists sets the key to v only if it has no value yet, and reports
// whether it did: safe to run from every replica when seeding a sequence
// from existing data.
func (s *Sequencer) SetIfNotExists(ctx context.Context, key string, v int64) (bool, error) {
	return s.set(ctx, key, v, "nx")
}

func (s *Sequencer) set(ctx context.Context, key string, v int64, mode string) (bool, error) {
	rk, err := s.redisKey(key)
	if err != nil {
		return false, err
	}
	limit := int64(maxExactValue)
	if s.cfg.MaxValue > 0 {
		limit = s.cfg.MaxValue
	}
	if v < 0 || v > limit {
		return false, fmt.Errorf("idgen: sequence value must be in [0, %d], got %d", limit, v)
	}
	n, err := setScript.Run(ctx, s.client, []string{rk}, strconv.FormatInt(v, 10), s.cfg.TTL.Milliseconds(), mode).Int()
	if err != nil {
		s.m.errors.WithLabelValues(reasonRedis).Inc()
		return false, fmt.Errorf("idgen: set sequence %q: %w", key, err)
	}
	return n == 1, nil
}
