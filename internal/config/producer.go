package config

import (
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// Producer is the kf-producer daemon's configuration.
type Producer struct {
	Common   `mapstructure:",squash"`
	Callback Callback `mapstructure:"callback"`
	WeCom    WeCom    `mapstructure:"wecom"`
	Sync     Sync     `mapstructure:"sync"`
	IDGen    IDGen    `mapstructure:"idgen"`
	Media    Media    `mapstructure:"media"`
}

// Callback configures the WeChat callback endpoint (I7, I8).
type Callback struct {
	// Addr is the callback server's listen address.
	Addr string `mapstructure:"addr" default:"127.0.0.1:8081"`
	// Path is the URL path WeChat posts to, as set in the WeChat Work
	// console; it starts with /.
	Path string `mapstructure:"path" default:"/wecom/callback"`
	// Token verifies WeChat's signature of each callback (the console's
	// Token); from the environment (KFPIPE_CALLBACK_TOKEN) in production.
	Token string `mapstructure:"token"`
	// EncodingAESKey decrypts the callbacks (the console's
	// EncodingAESKey, 43 characters); from the environment
	// (KFPIPE_CALLBACK_ENCODING_AES_KEY) in production.
	EncodingAESKey string `mapstructure:"encoding_aes_key"`
	// MaxBodyBytes bounds a callback's body; a larger one gets 413.
	MaxBodyBytes int `mapstructure:"max_body_bytes" default:"1048576" range:"[1024, 16777216]"`
	// TimestampWindow refuses a callback whose timestamp is further than
	// this from the clock, either way (0: not checked).
	TimestampWindow time.Duration `mapstructure:"timestamp_window" default:"5m" range:"[0, 24h]"`
	// ReplayWindow is how long a callback's (timestamp, nonce, signature)
	// is remembered: a repeat within it is acknowledged and not acted on.
	ReplayWindow time.Duration `mapstructure:"replay_window" default:"10m" range:"[1s, 24h]"`
}

// WeCom configures the WeChat Work API client.
type WeCom struct {
	// BaseURL is WeChat Work's API (a fake one in the demo and tests).
	BaseURL string `mapstructure:"base_url" default:"https://qyapi.weixin.qq.com"`
	// CorpID is the corp's ID; from the environment (KFPIPE_WECOM_CORP_ID)
	// in production. kf-producer needs it; the consumers' replies too.
	CorpID string `mapstructure:"corp_id"`
	// Secret is the customer-service app's secret; from the environment
	// (KFPIPE_WECOM_SECRET), never a committed file.
	Secret string `mapstructure:"secret"`
	// OpenKfIDs are accounts synced periodically even without callbacks;
	// empty, kf-producer lists the corp's accounts (account/list).
	OpenKfIDs []string `mapstructure:"open_kfids"`
	// RequestTimeout bounds one API call.
	RequestTimeout time.Duration `mapstructure:"request_timeout" default:"5s" range:"[100ms, 1m]"`
	// PageLimit is how many messages one sync_msg call asks for (WeChat's
	// most is 1000).
	PageLimit int `mapstructure:"page_limit" default:"1000" range:"[1, 1000]"`
	// DenyOpenKfIDs are accounts never synced, listed or not.
	DenyOpenKfIDs []string `mapstructure:"deny_open_kfids"`
	// AccountsRefresh is how often kf-producer lists the corp's accounts
	// (account/list) besides at start and on kf_account_auth_change, when
	// open_kfids is empty; 0 lists them only at start and on the event.
	AccountsRefresh time.Duration `mapstructure:"accounts_refresh" default:"10m" range:"[0,]"`
}

// Sync configures the per-open_kfid sync loop.
type Sync struct {
	Lock SyncLock `mapstructure:"lock"`
	// LockTTL is the lease of an account's sync lock: one kf-producer
	// syncs an account at a time, and another takes over this long after
	// it died.
	LockTTL time.Duration `mapstructure:"lock_ttl" default:"10s" range:"[1s, 10m]"`
	// SafetyInterval syncs every known account this often even without a
	// callback (a callback WeChat never delivered); 0 syncs only at start
	// and on callbacks.
	SafetyInterval time.Duration `mapstructure:"safety_interval" default:"1m" range:"[0, 24h]"`
	// RetryBase is the first wait before a failed sync is retried,
	// doubled each time up to retry_max.
	RetryBase time.Duration `mapstructure:"retry_base" default:"200ms" range:"[1ms, 1m]"`
	// RetryMax bounds the wait between retries; at least retry_base.
	RetryMax time.Duration `mapstructure:"retry_max" default:"30s" range:"[1ms, 1h]"`
	// Workers is how many accounts are synced at a time.
	Workers int `mapstructure:"workers" default:"8" range:"[1, 1024]"`
	// DeliveryWait bounds how long one page of messages waits for its
	// Kafka delivery reports (a page is never delivered with a hole, so
	// kafka.producer.delivery_timeout does not apply to it).
	DeliveryWait time.Duration `mapstructure:"delivery_wait" default:"45s" range:"[1s, 10m]"`
}

// SyncLock chooses where an account's sync lock and cursor live.
type SyncLock struct {
	// Backend redis (default: a Redis lock, the cursor written by a Lua
	// compare of the lock's token) or etcd (coord: a lease-bound lock, the
	// cursor written in a transaction comparing the lock key's create
	// revision; needs coord.enabled).
	Backend string `mapstructure:"backend" default:"redis" enum:"redis|etcd"`
}

// IDGen configures Snowflake IDs and the worker-ID allocator.
type IDGen struct {
	// Epoch is the Snowflake epoch, an RFC 3339 time in the past; never
	// change it once IDs were issued (they would repeat).
	Epoch string `mapstructure:"epoch" default:"2024-01-01T00:00:00Z"`
	// DatacenterID, when not 0, splits the 10 worker bits into 5 of
	// datacenter and 5 of worker (idgen.allocator.max_id at most 32).
	DatacenterID int       `mapstructure:"datacenter_id" range:"[0, 31]"`
	Allocator    Allocator `mapstructure:"allocator"`
	Sequencer    Sequencer `mapstructure:"sequencer"`
}

// Allocator configures worker-ID allocation.
type Allocator struct {
	// Backend redis|etcd; etcd uses the coord section's etcd (and its
	// coord.keep_alive as the lease, instead of TTL).
	Backend string `mapstructure:"backend" default:"redis" enum:"redis|etcd"`
	// MaxID is how many worker IDs there are (at most 32 with a
	// datacenter_id): the most kf-producers running at once.
	MaxID int `mapstructure:"max_id" default:"1024" range:"[1, 1024]"`
	// TTL is the lease of a worker ID on Redis: a dead kf-producer's ID is
	// free again this long after its last renewal.
	TTL time.Duration `mapstructure:"ttl" default:"30s" range:"[1s, 1h]"`
}

// Sequencer configures the Redis sequencer.
type Sequencer struct {
	// Driver is where sequences live: redis.
	Driver string `mapstructure:"driver" default:"redis" enum:"redis"`
	// Step is added per value.
	Step int64 `mapstructure:"step" default:"1" range:"[1, MaxSequenceValue]"`
	// MaxValue makes a sequence wrap back to step once it would pass it
	// (values then no longer increase), so at least step; 0 never wraps.
	MaxValue int64 `mapstructure:"max_value" range:"[0, MaxSequenceValue]"`
	// TTL expires a sequence idle this long; 0 keeps sequences forever.
	TTL time.Duration `mapstructure:"ttl" default:"24h" range:"[1s,]" zero:"kept forever"`
}

// MaxSequenceValue bounds idgen.sequencer.step and max_value: the
// sequencer's arithmetic runs in Redis Lua, whose numbers are doubles,
// exact only up to 2^53.
const MaxSequenceValue = 1 << 53

func defaultProducer(env string) Producer {
	var c Producer
	defaultCommon(&c.Common, env, "producer")
	c.Media.Dir = defaultMediaDir(env)
	names.SetDefaults(&c)
	return c
}

// Validate reports every invalid key.
func (c *Producer) Validate() error {
	v := &validator{}
	v.bounds(c)
	c.Common.validate(v)
	cb := c.Callback
	v.nonEmpty("callback.addr", cb.Addr)
	if len(cb.Path) == 0 || cb.Path[0] != '/' {
		v.addf("callback.path", "must start with /, got %q", cb.Path)
	}
	v.nonEmpty("callback.token", cb.Token)
	if len(cb.EncodingAESKey) != 43 {
		v.addf("callback.encoding_aes_key", "must be 43 characters, got %d", len(cb.EncodingAESKey))
	}
	w := c.WeCom
	w.validateClient(v)
	v.nonEmpty("wecom.corp_id", w.CorpID)
	v.nonEmpty("wecom.secret", w.Secret)
	for i, kf := range w.DenyOpenKfIDs {
		v.nonEmpty("wecom.deny_open_kfids["+itoa(i)+"]", kf)
	}
	for i, kf := range w.OpenKfIDs {
		v.nonEmpty("wecom.open_kfids["+itoa(i)+"]", kf)
	}
	c.Sync.validate(v)
	if c.Sync.Lock.Backend == "etcd" && !c.Coord.Enabled {
		v.addf("sync.lock.backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	c.IDGen.validate(v, c.Coord.Enabled)
	c.Media.validate(v)
	return v.err()
}

// validateClient checks the keys of the WeChat API client the tags
// cannot.
func (w WeCom) validateClient(v *validator) {
	if !schema.IsHTTPURL(w.BaseURL) {
		v.addf("wecom.base_url", "must be an http(s) URL, got %q", w.BaseURL)
	}
}

// validate checks the rule between the sync keys.
func (s Sync) validate(v *validator) {
	if s.RetryMax < s.RetryBase {
		v.addf("sync.retry_max", "must be >= sync.retry_base (%s), got %s", s.RetryBase, s.RetryMax)
	}
}

func (g IDGen) validate(v *validator, coordEnabled bool) {
	if t, err := time.Parse(time.RFC3339, g.Epoch); err != nil {
		v.addf("idgen.epoch", "must be an RFC 3339 time, got %q", g.Epoch)
	} else if t.After(time.Now()) {
		v.addf("idgen.epoch", "must not be in the future (IDs would be negative), got %s", g.Epoch)
	}
	if g.DatacenterID != 0 && g.Allocator.MaxID > 32 { // 5+5 bit layout
		v.addf("idgen.allocator.max_id", "must be in [1, 32] when idgen.datacenter_id is set, got %d", g.Allocator.MaxID)
	}
	if g.Allocator.Backend == "etcd" && !coordEnabled {
		v.addf("idgen.allocator.backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	q := g.Sequencer
	if q.MaxValue > 0 && q.MaxValue < q.Step {
		v.addf("idgen.sequencer.max_value", "must be 0 (no wrap) or >= idgen.sequencer.step (%d), got %d", q.Step, q.MaxValue)
	}
}

// EpochTime returns the parsed Snowflake epoch; Validate has checked it.
func (g IDGen) EpochTime() time.Time {
	t, err := time.Parse(time.RFC3339, g.Epoch)
	if err != nil {
		panic(fmt.Sprintf("idgen.epoch not validated: %v", err))
	}
	return t
}
