// Package redisconn opens the shared go-redis UniversalClient from
// configuration: a single node, Sentinel, or a Redis Cluster.
//
// On a Cluster every Lua script and MULTI must touch keys of one hash slot.
// Each Redis user therefore names its keys with Tag: the part of a key that
// groups it with the keys it is written together with becomes a hash tag
// ("{...}") on a Cluster, and stays as it was on a single node or Sentinel,
// so existing deployments keep their live keys (docs/operations.md,
// "Redis Cluster", says which keys share a slot and how to migrate).
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	switch c.Mode {
	case "sentinel":
		opts.MasterName = c.MasterName
		opts.Addrs = c.SentinelAddrs
	case "cluster":
		// The seeds give the slot map; MOVED and ASK (a failover, a slot
		// migration) are followed by the client, up to MaxRedirects.
		opts.Addrs = c.ClusterAddrs
		opts.IsClusterMode = true
		opts.DB = 0
	default:
		opts.Addrs = []string{c.Addr}
	}
	// UniversalClient picks a failover client when MasterName is set, a
	// cluster client with IsClusterMode, and a plain client for one address.
	return redis.NewUniversalClient(opts)
}

// IsCluster reports whether c talks to a Redis Cluster.
func IsCluster(c redis.UniversalClient) bool {
	_, ok := c.(*redis.ClusterClient)
	return ok
}

// Tag returns group as the hash tag "{group}" when c is a Cluster client,
// and group unchanged otherwise. Keys that a script or a MULTI writes
// together contain the same Tag, so on a Cluster they hash to one slot.
func Tag(c redis.UniversalClient, group string) string {
	if IsCluster(c) {
		return "{" + group + "}"
	}
	return group
}

// Slot is the Cluster hash slot of key (CRC16 of its hash tag, or of the
// whole key without one, mod 16384), for docs and load measurements.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC16-CCITT (XModem), the Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// ScanKeys calls fn with the keys matching match, in batches of up to
// count: on a Cluster from every master (SCAN is per node; the calls are
// serialized), elsewhere from the one server.
func ScanKeys(ctx context.Context, c redis.UniversalClient, match string, count int64, fn func(keys []string) error) error {
	scan := func(ctx context.Context, n redis.UniversalClient) error {
		var cursor uint64
		for {
			keys, next, err := n.Scan(ctx, cursor, match, count).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := fn(keys); err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		inner := fn
		fn = func(keys []string) error {
			mu.Lock()
			defer mu.Unlock()
			return inner(keys)
		}
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	}
	return scan(ctx, c)
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
	if cc, ok := c.(*redis.ClusterClient); ok {
		// Every node may become a master: each one is checked.
		var mu sync.Mutex
		var policy string
		var first error
		err := cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			p, err := checkEvictionPolicy(ctx, n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				policy, first = p, fmt.Errorf("node %s: %w", n.Options().Addr, err)
			}
			if first == nil {
				policy = p
			}
			return nil
		})
		if first != nil {
			return policy, first
		}
		return policy, err
	}
	return checkEvictionPolicy(ctx, c)
}

func checkEvictionPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
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

// Errors counts the commands Redis refused or that failed on the way, by
// kind (kfpipe_redis_errors_total), and remembers when Redis last refused
// a write for want of memory: a Redis at maxmemory under noeviction
// answers PING, so readiness alone would not show it.
type Errors struct {
	byKind  *prometheus.CounterVec
	lastOOM atomic.Int64 // unix nanoseconds; 0 never
}

// Instrument adds Errors' hook to c and registers its counter with reg.
func Instrument(c redis.UniversalClient, reg prometheus.Registerer) *Errors {
	e := &Errors{byKind: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_redis_errors_total",
		Help: "Redis commands that failed, by kind: oom (maxmemory reached: writes refused), readonly (a replica answered: failover), loading, timeout, connection, other.",
	}, []string{"kind"})}
	for _, k := range []string{"oom", "readonly", "loading", "timeout", "connection", "other"} {
		e.byKind.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(e.byKind)
	}
	c.AddHook(e)
	return e
}

// Kind classifies a command's error; "" for none (redis.Nil is an answer).
func Kind(err error) string {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return ""
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "OOM "):
			return "oom"
		case strings.HasPrefix(msg, "READONLY "):
			return "readonly"
		case strings.HasPrefix(msg, "LOADING "):
			return "loading"
		case strings.HasPrefix(msg, "NOSCRIPT "):
			return "" // go-redis answers it by sending the script
		}
		return "other"
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return "connection"
}

func (e *Errors) count(err error) {
	k := Kind(err)
	if k == "" {
		return
	}
	e.byKind.WithLabelValues(k).Inc()
	if k == "oom" {
		e.lastOOM.Store(time.Now().UnixNano())
	}
}

// DialHook implements redis.Hook.
func (e *Errors) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (e *Errors) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() != "client" { // connection set-up Redis 7.0 does not know; ignored
			e.count(err)
		}
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (e *Errors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "client" {
				continue // CLIENT SETINFO at connection set-up, as above
			}
			e.count(c.Err())
		}
		return err
	}
}

// OOMDetail is a /readyz detail: non-empty while Redis refused a write for
// want of memory in the last 30 s.
func (e *Errors) OOMDetail() string {
	at := e.lastOOM.Load()
	if at == 0 {
		return ""
	}
	ago := time.Since(time.Unix(0, at))
	if ago > 30*time.Second {
		return ""
	}
	return fmt.Sprintf("Redis refuses writes: out of memory (maxmemory reached, last refusal %s ago); nothing is committed that is not recorded — raise maxmemory or free memory",
		ago.Round(time.Second))
}
