package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

// SyncerConfig configures a Syncer. Most fields come from config.Producer
// (see SyncerConfigFrom); MaxPending and TokenTTL are this package's own.
type SyncerConfig struct {
	Topic          string        // kafka.topics.main.name
	KeyPrefix      string        // redis.key_prefix
	OpenKfIDs      []string      // wecom.open_kfids: synced at start and every SafetyInterval
	DenyOpenKfIDs  []string      // wecom.deny_open_kfids: never synced (accounts.go)
	PageLimit      int           // wecom.page_limit
	LockTTL        time.Duration // sync.lock_ttl
	SafetyInterval time.Duration // sync.safety_interval; 0 = only the sync at start
	RetryBase      time.Duration // sync.retry_base
	RetryMax       time.Duration // sync.retry_max
	Workers        int           // sync.workers
	DeliveryWait   time.Duration // sync.delivery_wait: how long one page waits for its reports
	// MaxPending bounds the distinct open_kfids waiting for a sync; a
	// Trigger beyond it gets ErrOverloaded. Default 4096.
	MaxPending int
	// TokenTTL is how long a callback token is offered to sync_msg after the
	// callback arrived (WeChat keeps it valid for 10 minutes). Default 9m.
	TokenTTL time.Duration
}

// SyncerConfigFrom takes the Syncer's settings from the daemon's config.
func SyncerConfigFrom(c *config.Producer) SyncerConfig {
	return SyncerConfig{
		Topic:          c.Kafka.Topics.Main.Name,
		KeyPrefix:      c.Redis.KeyPrefix,
		OpenKfIDs:      c.WeCom.OpenKfIDs,
		DenyOpenKfIDs:  c.WeCom.DenyOpenKfIDs,
		PageLimit:      c.WeCom.PageLimit,
		LockTTL:        c.Sync.LockTTL,
		SafetyInterval: c.Sync.SafetyInterval,
		RetryBase:      c.Sync.RetryBase,
		RetryMax:       c.Sync.RetryMax,
		Workers:        c.Sync.Workers,
		DeliveryWait:   c.Sync.DeliveryWait,
	}
}

func (c *SyncerConfig) setDefaults() {
	if c.MaxPending == 0 {
		c.MaxPending = 4096
	}
	if c.TokenTTL == 0 {
		c.TokenTTL = 9 * time.Minute
	}
}

// Validate reports every invalid field by its config key.
func (c SyncerConfig) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Topic == "" {
		add("kafka.topics.main.name", "must not be empty")
	}
	for i, kf := range c.OpenKfIDs {
		if kf == "" {
			add(fmt.Sprintf("wecom.open_kfids[%d]", i), "must not be empty")
		}
	}
	if c.PageLimit < 1 || c.PageLimit > 1000 {
		add("wecom.page_limit", "must be in [1, 1000], got %d", c.PageLimit)
	}
	// The sync timings have one bound each, kf-producer's configuration's.
	if err := (config.Sync{LockTTL: c.LockTTL, SafetyInterval: c.SafetyInterval, RetryBase: c.RetryBase,
		RetryMax: c.RetryMax, DeliveryWait: c.DeliveryWait}).ValidateTimings(); err != nil {
		errs = append(errs, err)
	}
	if c.TokenTTL < 0 || c.TokenTTL > 10*time.Minute {
		add("sync.token_ttl", "must be in [0s, 10m0s], got %s", c.TokenTTL)
	}
	if c.Workers < 1 || c.Workers > 1024 {
		add("sync.workers", "must be in [1, 1024], got %d", c.Workers)
	}
	if c.MaxPending < 1 {
		add("sync.max_pending", "must be >= 1, got %d", c.MaxPending)
	}
	return errors.Join(errs...)
}
