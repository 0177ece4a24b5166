package service

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
)

// Each daemon logs, once at start, the settings an operator needs to know
// are in force when reading its behaviour (which dedup store, how long a
// crashed owner's users wait, where the limiter's rules come from and how
// many groups it starts with, how dead letters are retried, how often the
// accounts are synced): the config file, the environment and the defaults
// together, as the daemon will use them.
const settingsMsg = "effective settings"

func logConsumerSettings(log *zap.Logger, cfg *config.Consumer) {
	log.Info(settingsMsg,
		zap.Duration("dedup.lease", cfg.Dedup.Lease),
		zap.Duration("dedup.ttl", cfg.Dedup.TTL), zap.String("dedup.legacy", cfg.Dedup.Legacy),
		zap.String("kafka.consumer.group_id", cfg.Kafka.Consumer.GroupID),
		zap.Duration("kafka.consumer.session_timeout", cfg.Kafka.Consumer.SessionTimeout),
		zap.Duration("kafka.consumer.commit_interval", cfg.Kafka.Consumer.CommitInterval),
		zap.Duration("processor.idle_timeout", cfg.Processor.IdleTimeout),
		zap.Dict("rate_limit", rateLimitFields(cfg.RateLimit)...))
}

func logProducerSettings(log *zap.Logger, cfg *config.Producer) {
	log.Info(settingsMsg,
		zap.Int("wecom.open_kfids", len(cfg.WeCom.OpenKfIDs)),
		zap.String("sync.lock.backend", cfg.Sync.Lock.Backend), zap.Duration("sync.lock_ttl", cfg.Sync.LockTTL),
		zap.Duration("sync.safety_interval", cfg.Sync.SafetyInterval),
		zap.Duration("sync.retry_base", cfg.Sync.RetryBase), zap.Duration("sync.retry_max", cfg.Sync.RetryMax),
		zap.Int("sync.workers", cfg.Sync.Workers),
		zap.String("idgen.allocator.backend", cfg.IDGen.Allocator.Backend),
		zap.String("kafka.topics.main.name", cfg.Kafka.Topics.Main.Name))
}

func logDLQSettings(log *zap.Logger, cfg *config.DLQConsumer) {
	log.Info(settingsMsg,
		zap.Duration("recovery.base_delay", cfg.Recovery.BaseDelay), zap.Duration("recovery.max_delay", cfg.Recovery.MaxDelay),
		zap.Duration("recovery.scan_interval", cfg.Recovery.ScanInterval),
		zap.String("recovery.max_retries", mapString(cfg.Recovery.MaxRetries)),
		zap.Duration("recovery.default_ttl", cfg.Recovery.DefaultTTL),
		zap.Duration("recovery.lock_ttl", cfg.Recovery.LockTTL),
		zap.String("kafka.topics.dlq.name", cfg.Kafka.Topics.DLQ.Name),
		zap.Dict("rate_limit", rateLimitFields(cfg.RateLimit)...))
}

// rateLimitFields says where the limiter's rules come from: the groups of
// the config file seed the rules store (rules_backend) the first time;
// after a `kfpipectl ratelimit set-rules` the stored rules are in force.
func rateLimitFields(c config.RateLimit) []zap.Field {
	groups := make([]string, 0, len(c.Groups))
	for _, n := range slices.Sorted(maps.Keys(c.Groups)) {
		g := c.Groups[n]
		groups = append(groups, fmt.Sprintf("%s=%d/%gs,penalty_after=%d,block=%gh", n, g.MaxMessages, g.WindowSeconds,
			g.PenaltyThreshold, g.BlockHours))
	}
	return []zap.Field{zap.Bool("enabled", c.Enabled), zap.String("rules_backend", c.RulesBackend),
		zap.String("default_group", c.DefaultGroup), zap.Int("groups", len(c.Groups)),
		zap.String("config_groups", strings.Join(groups, "; "))}
}

func mapString[V any](m map[string]V) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return strings.Join(parts, ",")
}
