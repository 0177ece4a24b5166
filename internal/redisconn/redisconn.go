// Package redisconn opens the shared go-redis UniversalClient from
// configuration: a single node or Sentinel, never Redis Cluster (locks and
// Lua scripts assume one primary).
package redisconn

import (
	"context"

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
