package config

import (
	"sort"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// DLQConsumer is the dlq-consumer daemon's configuration.
type DLQConsumer struct {
	Common    `mapstructure:",squash"`
	DLQ       DLQ       `mapstructure:"dlq"`
	Recovery  Recovery  `mapstructure:"recovery"`
	Admin     Admin     `mapstructure:"admin"`
	RateLimit RateLimit `mapstructure:"rate_limit"` // to pace re-injection inside a user's limit
	DLQIndex  DLQIndex  `mapstructure:"dlq_index"`
	Archive   Archive   `mapstructure:"archive"`
}

// DLQIndex bounds the Redis index of the DLQ topic (docs/operations.md,
// "The DLQ index in Redis").
type DLQIndex struct {
	// MaxEntries is the most entries the index holds; past it new dead
	// letters wait in the DLQ topic (alert KfpipeDLQIndexFull) until
	// expiry or a purge makes room. About 600 bytes of Redis each.
	MaxEntries int64 `mapstructure:"max_entries" default:"1_000_000" range:"[1000, 1_000_000_000]"`
}

// Recovery configures delayed retries of dead letters (docs/operations.md,
// "Dead-letter reasons").
type Recovery struct {
	// BaseDelay is a letter's first retry delay, doubled at each retry up
	// to max_delay (the reason's backoff; docs/operations.md).
	BaseDelay time.Duration `mapstructure:"base_delay" default:"1m" range:"[1ms, 24h]"`
	// MaxDelay bounds a retry's delay; at least base_delay.
	MaxDelay time.Duration `mapstructure:"max_delay" default:"1h" range:"[1ms, 168h]"`
	// ScanInterval is how often the scheduler looks for letters due.
	ScanInterval time.Duration `mapstructure:"scan_interval" default:"1s" range:"[10ms, 1m]"`
	// MaxRetries is, by dead-letter reason, how many times a letter is
	// retried before it waits for an operator (manual review); a reason
	// not listed keeps the reason table's (internal/deadletter).
	MaxRetries map[string]int `mapstructure:"max_retries" range:"[0, 1000]"`
	// TTL is, by dead-letter reason, how long a letter of that reason
	// stays retryable; a reason not listed keeps default_ttl.
	TTL map[string]time.Duration `mapstructure:"ttl" range:"[1m,]"`
	// DefaultTTL is how long a letter stays retryable (then it expires
	// from the DLQ index): at most kafka.topics.dlq.retention_ms, at most
	// dedup.ttl.
	DefaultTTL time.Duration `mapstructure:"default_ttl" default:"DefaultRecoveryTTL" range:"[1m,]"`
	// LockTTL is the lease of the scheduler's lock: one dlq-consumer
	// re-injects at a time, and another takes over this long after it
	// died.
	LockTTL time.Duration `mapstructure:"lock_ttl" default:"10s" range:"[1s, 10m]"`
}

// Admin configures the admin API and console.
type Admin struct {
	// Addr is the admin API's and console's listen address.
	Addr string `mapstructure:"addr" default:"127.0.0.1:8090"`
	// Tokens are the bearer tokens the API accepts, each a name (for the
	// audit log), a token of at least 16 characters and a role (viewer
	// reads, operator also retries and purges); from the environment
	// (KFPIPE_ADMIN_TOKENS=name:role:token,…), never a committed file.
	Tokens []AdminToken `mapstructure:"tokens"`
	// MaxBodyBytes bounds a request's body.
	MaxBodyBytes int `mapstructure:"max_body_bytes" default:"65536" range:"[1024, 16777216]"`
	// ConsumerGroup is the schedule-consumers' group (their
	// kafka.consumer.group_id) whose lag on the main topic the console's
	// overview shows.
	ConsumerGroup string `mapstructure:"consumer_group" default:"kfpipe-consumer"`
	// BatchRate is how many letters a second an operator's batch retry or
	// purge acts on (the console's and kfpipectl's bulk actions).
	BatchRate int `mapstructure:"batch_rate" default:"200" range:"[1, 100000]"`
}

// AdminToken is one bearer token and its role.
type AdminToken struct {
	// Name names the token's holder in the audit log.
	Name string `mapstructure:"name"`
	// Token is the bearer token, at least 16 characters.
	Token string `mapstructure:"token"`
	// Role is viewer (reads) or operator (also retries and purges).
	Role string `mapstructure:"role" enum:"viewer|operator"`
}

func defaultDLQConsumer(env string) DLQConsumer {
	var c DLQConsumer
	defaultCommon(&c.Common, env, "dlq")
	c.Recovery.MaxRetries = deadletter.DefaultMaxRetriesByName()
	c.Recovery.TTL = map[string]time.Duration{}
	c.RateLimit.Groups = defaultRateGroups()
	names.SetDefaults(&c)
	return c
}

// Validate reports every invalid key.
func (c *DLQConsumer) Validate() error {
	v := &validator{}
	v.bounds(c)
	c.Common.validate(v)
	c.DLQ.validate(v)
	c.Archive.validate(v)
	r := c.Recovery
	if r.MaxDelay < r.BaseDelay {
		v.addf("recovery.max_delay", "must be >= recovery.base_delay (%s), got %s", r.BaseDelay, r.MaxDelay)
	}
	// The scheduler renews its lock at each scan: a lease shorter than the
	// scan interval would lapse between two scans.
	if r.LockTTL < r.ScanInterval {
		v.addf("recovery.lock_ttl", "must be >= recovery.scan_interval (%s), got %s", r.ScanInterval, r.LockTTL)
	}
	for _, k := range sortedKeys(r.MaxRetries) {
		// A mistyped reason would otherwise be ignored and its reason
		// keep the default.
		if !deadletter.Reason(k).Known() {
			v.addf("recovery.max_retries."+k, "is not a dead-letter reason (known: %s)", strings.Join(deadletter.Names(), ", "))
		}
	}
	// The index reads a letter back from the DLQ topic by its coordinates
	// for as long as it keeps the letter: the topic must keep it as long.
	if ret := c.Kafka.Topics.DLQ.RetentionMs; ret > 0 {
		keep := time.Duration(ret) * time.Millisecond
		ttls := map[string]time.Duration{"recovery.default_ttl": r.DefaultTTL}
		for k, d := range r.TTL {
			ttls["recovery.ttl."+k] = d
		}
		for _, k := range sortedKeys(ttls) {
			if ttls[k] > keep {
				v.addf(k, "%s is longer than kafka.topics.dlq.retention_ms (%s): the DLQ index reads letters back from the topic, which must keep them at least as long", ttls[k], keep)
			}
		}
	}
	v.nonEmpty("admin.addr", c.Admin.Addr)
	v.nonEmpty("admin.consumer_group", c.Admin.ConsumerGroup)
	names, tokens := map[string]bool{}, map[string]bool{}
	for i, t := range c.Admin.Tokens {
		key := "admin.tokens[" + itoa(i) + "]"
		v.nonEmpty(key+".name", t.Name)
		if t.Name != "" && names[t.Name] {
			v.addf(key+".name", "%q is used twice: audit entries would not say who", t.Name)
		}
		names[t.Name] = true
		if len(t.Token) < 16 {
			v.addf(key+".token", "must be at least 16 characters, got %d", len(t.Token))
		} else if tokens[t.Token] {
			v.addf(key+".token", "is used twice")
		}
		tokens[t.Token] = true
	}
	c.RateLimit.validate(v, c.Coord.Enabled)
	return v.err()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
