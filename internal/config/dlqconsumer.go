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
}

// DLQIndex bounds the Redis index of the DLQ topic (docs/operations.md,
// "The DLQ index in Redis").
type DLQIndex struct {
	// MaxEntries is the most entries the index holds; past it new dead
	// letters wait in the DLQ topic (alert KfpipeDLQIndexFull) until
	// expiry or a purge makes room. About 600 bytes of Redis each.
	MaxEntries int64 `mapstructure:"max_entries"`
}

// Recovery configures delayed retries of dead letters (docs/operations.md,
// "Dead-letter reasons").
type Recovery struct {
	BaseDelay    time.Duration            `mapstructure:"base_delay"`
	MaxDelay     time.Duration            `mapstructure:"max_delay"`
	ScanInterval time.Duration            `mapstructure:"scan_interval"`
	MaxRetries   map[string]int           `mapstructure:"max_retries"` // by reason
	TTL          map[string]time.Duration `mapstructure:"ttl"`         // by reason
	DefaultTTL   time.Duration            `mapstructure:"default_ttl"`
	LockTTL      time.Duration            `mapstructure:"lock_ttl"`
}

// Admin configures the admin API and console.
type Admin struct {
	Addr         string       `mapstructure:"addr"`
	Tokens       []AdminToken `mapstructure:"tokens"`
	MaxBodyBytes int          `mapstructure:"max_body_bytes"`
	// ConsumerGroup is the schedule-consumers' group (their
	// kafka.consumer.group_id) whose lag on the main topic the console's
	// overview shows.
	ConsumerGroup string `mapstructure:"consumer_group"`
	// BatchRate is how many letters a second an operator's batch retry or
	// purge acts on (the console's and kfpipectl's bulk actions).
	BatchRate int `mapstructure:"batch_rate"`
}

// AdminToken is one bearer token and its role.
type AdminToken struct {
	Name  string `mapstructure:"name"`
	Token string `mapstructure:"token"`
	Role  string `mapstructure:"role"` // viewer|operator
}

func defaultDLQConsumer(env string) DLQConsumer {
	c := DLQConsumer{
		Common: defaultCommon(env, "dlq"),
		DLQ:    defaultDLQ(),
		Recovery: Recovery{BaseDelay: time.Minute, MaxDelay: time.Hour, ScanInterval: time.Second,
			MaxRetries: deadletter.DefaultMaxRetriesByName(),
			TTL:        map[string]time.Duration{}, DefaultTTL: DefaultRecoveryTTL, LockTTL: 10 * time.Second},
		Admin:     Admin{Addr: "127.0.0.1:8090", MaxBodyBytes: 64 << 10, ConsumerGroup: "kfpipe-consumer", BatchRate: 200},
		DLQIndex:  DLQIndex{MaxEntries: 1_000_000},
		RateLimit: DefaultRateLimit(),
	}
	c.Kafka.Consumer.GroupID = "kfpipe-dlq"
	return c
}

// Validate reports every invalid key.
func (c *DLQConsumer) Validate() error {
	v := &validator{}
	c.Common.validate(v)
	c.DLQ.validate(v)
	r := c.Recovery
	v.durationBetween("recovery.base_delay", r.BaseDelay, time.Millisecond, 24*time.Hour)
	v.durationBetween("recovery.max_delay", r.MaxDelay, r.BaseDelay, 7*24*time.Hour)
	v.durationBetween("recovery.scan_interval", r.ScanInterval, 10*time.Millisecond, time.Minute)
	v.durationAtLeast("recovery.default_ttl", r.DefaultTTL, time.Minute)
	v.durationBetween("recovery.lock_ttl", r.LockTTL, time.Second, 10*time.Minute)
	for _, k := range sortedKeys(r.MaxRetries) {
		// A mistyped reason would otherwise be ignored and its reason
		// keep the default.
		if !deadletter.Reason(k).Known() {
			v.addf("recovery.max_retries."+k, "is not a dead-letter reason (known: %s)", strings.Join(deadletter.Names(), ", "))
			continue
		}
		v.between("recovery.max_retries."+k, r.MaxRetries[k], 0, 1000)
	}
	for _, k := range sortedKeys(r.TTL) {
		v.durationAtLeast("recovery.ttl."+k, r.TTL[k], time.Minute)
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
	if n := c.DLQIndex.MaxEntries; n < 1000 || n > 1_000_000_000 {
		v.addf("dlq_index.max_entries", "must be between 1000 and 1000000000, got %d", n)
	}
	v.nonEmpty("admin.addr", c.Admin.Addr)
	v.between("admin.max_body_bytes", c.Admin.MaxBodyBytes, 1024, 16<<20)
	v.nonEmpty("admin.consumer_group", c.Admin.ConsumerGroup)
	v.between("admin.batch_rate", c.Admin.BatchRate, 1, 100000)
	for i, t := range c.Admin.Tokens {
		key := "admin.tokens[" + itoa(i) + "]"
		v.nonEmpty(key+".name", t.Name)
		if len(t.Token) < 16 {
			v.addf(key+".token", "must be at least 16 characters, got %d", len(t.Token))
		}
		v.oneOf(key+".role", t.Role, "viewer", "operator")
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
