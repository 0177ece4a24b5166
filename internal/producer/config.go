package producer

import (
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
)

// SyncerConfig configures a Syncer. Most fields come from config.Producer
// (see SyncerConfigFrom), which checked them when it loaded; MaxPending and
// TokenTTL are this package's own.
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
