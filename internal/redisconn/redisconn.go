// Package redisconn opens the shared go-redis UniversalClient from
// configuration: a single node or Sentinel, never Redis Cluster (locks and
// Lua scripts assume one primary).
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
)

// New returns a client for c; it does not connect until first use.
func New(c config.Redis) redis.UniversalClient {
	opts := &redis.UniversalOptions{
		DB:           c.DB,
		Password:     c.Password,
		PoolSize:     c.PoolSize,
		DialTimeout:  c.DialTimeout,
		ReadTimeout:  c.ReadTimeout,
		WriteTimeout: c.WriteTimeout,
	}
	if c.Mode == "sentinel" {
		opts.MasterName = c.MasterName
		opts.Addrs = c.SentinelAddrs
	} else {
		opts.Addrs = []string{c.Addr}
	}
	// UniversalClient picks a failover client when MasterName is set and a
	// plain client for one address.
	return redis.NewUniversalClient(opts)
}

// Ping is the readiness check for Redis.
func Ping(c redis.UniversalClient) func(ctx context.Context) error {
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }
}

// ErrEvictionPolicy is returned by CheckEvictionPolicy when Redis may evict
// kfpipe's keys, or when its policy cannot be read.
var ErrEvictionPolicy = errors.New("redis eviction policy")

// CheckEvictionPolicy reads the server's maxmemory-policy (on the primary,
// with Sentinel) and refuses a policy that may evict kfpipe's keys: every
// dedup mark, claim, cursor, lock and DLQ-index entry has a TTL, so the
// volatile-* policies may evict them as surely as the allkeys-* ones, and
// an evicted done mark repeats an effect, an evicted cursor re-pulls
// WeChat's messages. noeviction passes: a full Redis then refuses writes,
// which kfpipe treats as Redis being unavailable (nothing is committed
// that is not recorded). A server that refuses CONFIG (a managed Redis)
// is an error too, naming the override. Other errors (Redis unreachable)
// are returned as they are, for the caller to retry.
func CheckEvictionPolicy(ctx context.Context, c redis.UniversalClient) (string, error) {
	res, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		var re redis.Error
		if errors.As(err, &re) {
			return "", fmt.Errorf("%w: cannot read maxmemory-policy (CONFIG GET refused: %v); "+
				"if this managed Redis hides CONFIG and its policy is noeviction, set redis.skip_eviction_policy_check: true",
				ErrEvictionPolicy, err)
		}
		return "", err
	}
	policy := res["maxmemory-policy"]
	if strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-") {
		return policy, fmt.Errorf("%w: Redis maxmemory-policy is %q: it may evict kfpipe's dedup marks, claims, cursors, "+
			"locks and DLQ-index entries (all carry TTLs), which repeats effects and loses cursors; set "+
			"maxmemory-policy noeviction on the Redis server (CONFIG SET maxmemory-policy noeviction, and in redis.conf)",
			ErrEvictionPolicy, policy)
	}
	return policy, nil
}
