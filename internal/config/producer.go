package config

import (
	"fmt"
	"net/url"
	"time"
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
	Addr            string        `mapstructure:"addr"`
	Path            string        `mapstructure:"path"`
	Token           string        `mapstructure:"token"`
	EncodingAESKey  string        `mapstructure:"encoding_aes_key"`
	MaxBodyBytes    int           `mapstructure:"max_body_bytes"`
	TimestampWindow time.Duration `mapstructure:"timestamp_window"`
	ReplayWindow    time.Duration `mapstructure:"replay_window"`
}

// WeCom configures the WeChat Work API client.
type WeCom struct {
	BaseURL        string        `mapstructure:"base_url"`
	CorpID         string        `mapstructure:"corp_id"`
	Secret         string        `mapstructure:"secret"`
	OpenKfIDs      []string      `mapstructure:"open_kfids"` // synced periodically even without callbacks
	RequestTimeout time.Duration `mapstructure:"request_timeout"`
	PageLimit      int           `mapstructure:"page_limit"`
	// DenyOpenKfIDs are accounts never synced, listed or not.
	DenyOpenKfIDs []string `mapstructure:"deny_open_kfids"`
	// AccountsRefresh is how often kf-producer lists the corp's accounts
	// (account/list) besides at start and on kf_account_auth_change, when
	// open_kfids is empty; 0 lists them only at start and on the event.
	AccountsRefresh time.Duration `mapstructure:"accounts_refresh"`
}

// Sync configures the per-open_kfid sync loop.
type Sync struct {
	Lock           SyncLock      `mapstructure:"lock"`
	LockTTL        time.Duration `mapstructure:"lock_ttl"`
	SafetyInterval time.Duration `mapstructure:"safety_interval"`
	RetryBase      time.Duration `mapstructure:"retry_base"`
	RetryMax       time.Duration `mapstructure:"retry_max"`
	Workers        int           `mapstructure:"workers"`
	DeliveryWait   time.Duration `mapstructure:"delivery_wait"`
}

// SyncLock chooses where an account's sync lock and cursor live.
type SyncLock struct {
	// Backend redis (default: a Redis lock, the cursor written by a Lua
	// compare of the lock's token) or etcd (coord: a lease-bound lock, the
	// cursor written in a transaction comparing the lock key's create
	// revision; needs coord.enabled).
	Backend string `mapstructure:"backend"`
}

// IDGen configures Snowflake IDs and the worker-ID allocator.
type IDGen struct {
	Epoch        string    `mapstructure:"epoch"` // RFC 3339
	DatacenterID int       `mapstructure:"datacenter_id"`
	Allocator    Allocator `mapstructure:"allocator"`
	Sequencer    Sequencer `mapstructure:"sequencer"`
}

// Allocator configures worker-ID allocation.
type Allocator struct {
	// Backend redis|etcd; etcd uses the coord section's etcd (and its
	// coord.keep_alive as the lease, instead of TTL).
	Backend string        `mapstructure:"backend"`
	MaxID   int           `mapstructure:"max_id"`
	TTL     time.Duration `mapstructure:"ttl"`
}

// Sequencer configures the Redis sequencer.
type Sequencer struct {
	Driver   string        `mapstructure:"driver"`
	Step     int64         `mapstructure:"step"`
	MaxValue int64         `mapstructure:"max_value"`
	TTL      time.Duration `mapstructure:"ttl"`
}

func defaultProducer(env string) Producer {
	return Producer{
		Common: defaultCommon(env, "producer"),
		Callback: Callback{Addr: "127.0.0.1:8081", Path: "/wecom/callback", MaxBodyBytes: 1 << 20,
			TimestampWindow: 5 * time.Minute, ReplayWindow: 10 * time.Minute},
		WeCom: WeCom{BaseURL: "https://qyapi.weixin.qq.com", RequestTimeout: 5 * time.Second, PageLimit: 1000,
			AccountsRefresh: 10 * time.Minute},
		Sync: Sync{Lock: SyncLock{Backend: "redis"}, LockTTL: 10 * time.Second, SafetyInterval: time.Minute, RetryBase: 200 * time.Millisecond,
			RetryMax: 30 * time.Second, Workers: 8, DeliveryWait: 45 * time.Second},
		IDGen: IDGen{Epoch: "2024-01-01T00:00:00Z",
			Allocator: Allocator{Backend: "redis", MaxID: 1024, TTL: 30 * time.Second},
			Sequencer: Sequencer{Driver: "redis", Step: 1, MaxValue: 0, TTL: 24 * time.Hour}},
		Media: defaultMedia(env),
	}
}

// Validate reports every invalid key.
func (c *Producer) Validate() error {
	v := &validator{}
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
	v.between("callback.max_body_bytes", cb.MaxBodyBytes, 1024, 16<<20)
	v.durationBetween("callback.timestamp_window", cb.TimestampWindow, 0, 24*time.Hour)
	v.durationBetween("callback.replay_window", cb.ReplayWindow, time.Second, 24*time.Hour)
	w := c.WeCom
	w.validateClient(v)
	v.nonEmpty("wecom.corp_id", w.CorpID)
	v.nonEmpty("wecom.secret", w.Secret)
	v.between("wecom.page_limit", w.PageLimit, 1, 1000)
	for i, kf := range w.DenyOpenKfIDs {
		v.nonEmpty("wecom.deny_open_kfids["+itoa(i)+"]", kf)
	}
	if w.AccountsRefresh < 0 {
		v.addf("wecom.accounts_refresh", "must not be negative")
	}
	for i, kf := range w.OpenKfIDs {
		v.nonEmpty("wecom.open_kfids["+itoa(i)+"]", kf)
	}
	s := c.Sync
	s.validate(v)
	v.oneOf("sync.lock.backend", s.Lock.Backend, "redis", "etcd")
	if s.Lock.Backend == "etcd" && !c.Coord.Enabled {
		v.addf("sync.lock.backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	v.between("sync.workers", s.Workers, 1, 1024)
	c.IDGen.validate(v, c.Coord.Enabled)
	c.Media.validate(v)
	return v.err()
}

// validateClient checks the keys of the WeChat API client.
func (w WeCom) validateClient(v *validator) {
	if u, err := url.Parse(w.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.addf("wecom.base_url", "must be an http(s) URL, got %q", w.BaseURL)
	}
	v.durationBetween("wecom.request_timeout", w.RequestTimeout, 100*time.Millisecond, time.Minute)
}

// ValidateTimings reports every sync duration out of its range, by its
// key; the syncer (package producer) checks the timings it is given with
// it, so kf-producer's configuration and the syncer share one bound each.
func (s Sync) ValidateTimings() error {
	v := &validator{}
	s.validate(v)
	return v.err()
}

func (s Sync) validate(v *validator) {
	v.durationBetween("sync.lock_ttl", s.LockTTL, time.Second, 10*time.Minute)
	v.durationBetween("sync.safety_interval", s.SafetyInterval, 0, 24*time.Hour)
	v.durationBetween("sync.retry_base", s.RetryBase, time.Millisecond, time.Minute)
	v.durationBetween("sync.retry_max", s.RetryMax, s.RetryBase, time.Hour)
	v.durationBetween("sync.delivery_wait", s.DeliveryWait, time.Second, 10*time.Minute)
}

func (g IDGen) validate(v *validator, coordEnabled bool) {
	if t, err := time.Parse(time.RFC3339, g.Epoch); err != nil {
		v.addf("idgen.epoch", "must be an RFC 3339 time, got %q", g.Epoch)
	} else if t.After(time.Now()) {
		v.addf("idgen.epoch", "must not be in the future (IDs would be negative), got %s", g.Epoch)
	}
	v.between("idgen.datacenter_id", g.DatacenterID, 0, 31)
	a := g.Allocator
	v.oneOf("idgen.allocator.backend", a.Backend, "redis", "etcd")
	maxID := 1024
	if g.DatacenterID != 0 {
		maxID = 32 // 5+5 bit layout
	}
	v.between("idgen.allocator.max_id", a.MaxID, 1, maxID)
	v.durationBetween("idgen.allocator.ttl", a.TTL, time.Second, time.Hour)
	if a.Backend == "etcd" && !coordEnabled {
		v.addf("idgen.allocator.backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	q := g.Sequencer
	v.oneOf("idgen.sequencer.driver", q.Driver, "redis")
	if q.Step < 1 {
		v.addf("idgen.sequencer.step", "must be >= 1, got %d", q.Step)
	}
	if q.MaxValue < 0 {
		v.addf("idgen.sequencer.max_value", "must be >= 0 (0 = no wrap), got %d", q.MaxValue)
	}
	if q.MaxValue > 0 && q.MaxValue < q.Step {
		v.addf("idgen.sequencer.max_value", "must be 0 (no wrap) or >= idgen.sequencer.step (%d), got %d", q.Step, q.MaxValue)
	}
	// 0 keeps sequences forever; a positive TTL shorter than a second
	// would expire a sequence between two calls.
	if q.TTL != 0 {
		v.durationAtLeast("idgen.sequencer.ttl", q.TTL, time.Second)
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
