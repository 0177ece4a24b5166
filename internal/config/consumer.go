package config

import (
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/state"
)

// Consumer is the schedule-consumer daemon's configuration.
type Consumer struct {
	Common    `mapstructure:",squash"`
	Processor Processor `mapstructure:"processor"`
	Outage    Outage    `mapstructure:"outage"`
	Dedup     Dedup     `mapstructure:"dedup"`
	RateLimit RateLimit `mapstructure:"rate_limit"`
	Breaker   Breaker   `mapstructure:"breaker"`
	Handler   Handler   `mapstructure:"handler"`
	DLQ       DLQ       `mapstructure:"dlq"`
	// WeCom is the API the handlers' replies go through (kfpipe.Reply);
	// optional: without corp_id and secret, replies fail with an error
	// that says so.
	WeCom WeCom `mapstructure:"wecom"`
	// Media is where handlers read inbound media (kfpipe.OpenMedia).
	Media Media `mapstructure:"media"`
	// Recovery is the dlq-consumer's retry horizon, read from the same
	// file: dedup.ttl must cover it (a retried letter whose message was
	// done must still find its mark).
	Recovery RetryHorizon `mapstructure:"recovery"`
}

// RetryHorizon is the part of the dlq-consumer's recovery section the
// schedule-consumer checks dedup.ttl against: how long a letter stays
// retryable, per reason and by default.
type RetryHorizon struct {
	TTL        map[string]time.Duration `mapstructure:"ttl"`
	DefaultTTL time.Duration            `mapstructure:"default_ttl"`
}

// DefaultRecoveryTTL is recovery.default_ttl's default: a letter stays
// retryable a week.
const DefaultRecoveryTTL = 7 * 24 * time.Hour

// Processor configures per-user actors and per-partition flow control.
type Processor struct {
	MailboxSize        int           `mapstructure:"mailbox_size"`
	IdleTimeout        time.Duration `mapstructure:"idle_timeout"`
	MaxInFlight        int           `mapstructure:"max_in_flight"` // per partition; pause above
	ResumeBelow        int           `mapstructure:"resume_below"`  // per partition; resume below
	RetryAttempts      int           `mapstructure:"retry_attempts"`
	RetryBase          time.Duration `mapstructure:"retry_base"`
	RetryMax           time.Duration `mapstructure:"retry_max"`
	AttemptTimeout     time.Duration `mapstructure:"attempt_timeout"`
	MaxMessageBytes    int           `mapstructure:"max_message_bytes"`
	PipelineFlush      time.Duration `mapstructure:"pipeline_flush"` // Redis batching window
	PipelineMaxBatched int           `mapstructure:"pipeline_max_batched"`
	// DeadLetterQueue is how many dead letters of one partition may wait
	// for their durable DLQ write before the partition is paused (it
	// resumes below half of it): a slow DLQ then holds back only the
	// partitions that dead-letter, never the poll goroutine (I5, I6).
	DeadLetterQueue int `mapstructure:"dead_letter_queue"`
	// StandbyAfterRedisLost: a consumer whose Redis has been unreachable
	// this long leaves its group (its partitions go to members that still
	// have Redis) and joins again once Redis answers; 0 never leaves.
	StandbyAfterRedisLost time.Duration `mapstructure:"standby_after_redis_lost"`
}

// Outage configures the consumer's downstream health gate: when the
// handler fails for many users at once, messages wait (a few probe the
// downstream) instead of being dead-lettered (docs/operations.md).
type Outage struct {
	// MinUsers distinct users with a retryable failure within Window open
	// the gate (0 turns it off) ...
	MinUsers int `mapstructure:"min_users"`
	// ... when failures are at least FailureRatio of the attempts.
	FailureRatio float64       `mapstructure:"failure_ratio"`
	Window       time.Duration `mapstructure:"window"`
	// Probes handler calls at a time while open, one started every
	// ProbeInterval.
	Probes        int           `mapstructure:"probes"`
	ProbeInterval time.Duration `mapstructure:"probe_interval"`
}

// Dedup configures the idempotency keys (I3).
type Dedup struct {
	TTL time.Duration `mapstructure:"ttl"` // >= 3 days: WeChat's re-pull window
	// Lease is how long a "processing" claim lives without renewal: it
	// bounds how long a crashed consumer's users wait for their claims
	// (about the group session timeout), while a live owner renews it
	// every quarter lease and stops its handler after two thirds without a
	// successful renewal.
	Lease time.Duration `mapstructure:"lease"`
	// Store is no longer a setting (one per-partition store); it is read
	// only to refuse a configuration that still sets it.
	Store string `mapstructure:"store"`
	// Legacy: read (the default) also looks a message up among the marks
	// of the old dedup stores (claims and leases), off does not. Keep it
	// read for one dedup.ttl after switching from either
	// (docs/operations.md, "Switching to the per-partition store").
	Legacy string `mapstructure:"legacy"`
	// Buckets is how many digest sets a partition's done marks of one
	// 10-second send-time slot are spread over, so that each stays a Redis
	// intset (at most ~400 members: 8 B a mark; beyond 512 Redis converts
	// it to a hash table, ~70 B a mark). Size it as messages a second per
	// partition × 10 / 400, rounded up to a power of two: 1 up to ~40 msg/s
	// a partition, 16 for the seeds' 5,000 msg/s over 12 partitions. A
	// change applies from the next slot, at most once per dedup.ttl (the
	// marks written before stay found; docs/operations.md).
	Buckets int `mapstructure:"buckets"`
}

// RateLimit configures the per-user sliding-window limiter (package ratelimit).
type RateLimit struct {
	Enabled bool `mapstructure:"enabled"`
	// RulesBackend is where the operators' rules override and per-user
	// group assignments live: redis (rl:rules, changes announced on Redis
	// pub/sub) or etcd (coord's config center, followed by a watch; needs
	// coord.enabled). Blocks stay in Redis either way.
	RulesBackend string               `mapstructure:"rules_backend"`
	DefaultGroup string               `mapstructure:"default_group"`
	Groups       map[string]RateGroup `mapstructure:"groups"`
	Progressive  Progressive          `mapstructure:"progressive"`
}

// RateGroup is one group's window rule.
type RateGroup struct {
	WindowSeconds    float64 `mapstructure:"window_seconds"`
	MaxMessages      int     `mapstructure:"max_messages"`
	PenaltyThreshold int     `mapstructure:"penalty_threshold"`
	BlockHours       float64 `mapstructure:"block_hours"`
}

// Progressive configures the optional escalating block.
type Progressive struct {
	Enabled bool          `mapstructure:"enabled"`
	Base    time.Duration `mapstructure:"base"`
	Max     time.Duration `mapstructure:"max"`
	History time.Duration `mapstructure:"history"`
}

// Breaker configures the per-user circuit breaker.
type Breaker struct {
	FailureThreshold int           `mapstructure:"failure_threshold"`
	OpenTimeout      time.Duration `mapstructure:"open_timeout"`
	HalfOpenMax      int           `mapstructure:"half_open_max"`
}

// Handler selects the business handler.
type Handler struct {
	Type string      `mapstructure:"type"` // log|http|noop
	HTTP HTTPHandler `mapstructure:"http"`
}

// HTTPHandler posts each message to a URL.
type HTTPHandler struct {
	URL     string        `mapstructure:"url"`
	Timeout time.Duration `mapstructure:"timeout"`
	// MaxConns caps the connections (and so the requests in flight) to
	// the receiver; that many are kept alive between messages. Actors
	// beyond it wait for a connection, bounded by the attempt's timeout.
	MaxConns int `mapstructure:"max_conns"`
	// Secret signs each request (Kfpipe-Signature, HMAC-SHA256 over the
	// timestamp and the body; docs/handler-protocol.md) so the receiver can
	// reject forgeries and replays. From the environment
	// (KFPIPE_HANDLER_HTTP_SECRET), never the file. Empty: unsigned.
	Secret string `mapstructure:"secret"`
}

// emergencyPath is EmergencyFile with "{daemon}" replaced by the daemon's
// name: one shared file serves every daemon, but two processes must never
// append to the same emergency file (the file is locked; the second one
// refuses to start).
func (d DLQ) emergencyPath(daemon string) string {
	return strings.ReplaceAll(d.EmergencyFile, "{daemon}", daemon)
}

// DLQ configures the dead-letter producer side (I6).
type DLQ struct {
	EmergencyFile   string        `mapstructure:"emergency_file"`
	ReplayInterval  time.Duration `mapstructure:"replay_interval"`
	ProduceTimeout  time.Duration `mapstructure:"produce_timeout"`
	BreakerFailures int           `mapstructure:"breaker_failures"`
	BreakerOpen     time.Duration `mapstructure:"breaker_open"`
}

// defaultRateGroups are the shipped rules (docs/operations.md, "The rate
// limiter's rules"). normal lets a person's burst through — a dozen
// messages within seconds, eight photos, a question pasted line by line,
// up to 30 in any minute — and blocks only sustained excess: 20 refusals
// before the window drains to half. Its long-run rate is the seed's
// (30 a minute); the seed's own rule (5 per 10 s, 3 violations, 1 h),
// which blocks such a burst, stays available as the group seed.
func defaultRateGroups() map[string]RateGroup {
	return map[string]RateGroup{
		"normal":     {WindowSeconds: 60, MaxMessages: 30, PenaltyThreshold: 20, BlockHours: 1},
		"seed":       {WindowSeconds: 10, MaxMessages: 5, PenaltyThreshold: 3, BlockHours: 1},
		"vip":        {WindowSeconds: 60, MaxMessages: 120, PenaltyThreshold: 40, BlockHours: 0.5},
		"suspicious": {WindowSeconds: 30, MaxMessages: 3, PenaltyThreshold: 1, BlockHours: 24},
		"whitelist":  {WindowSeconds: 1, MaxMessages: 9999, PenaltyThreshold: 9999, BlockHours: 0},
	}
}

// DefaultRateLimit is the shipped rate_limit section (the consumer's and
// the DLQ daemon's, which paces re-injection by it): enabled, default group
// normal, the groups of defaultRateGroups, progressive penalty off.
func DefaultRateLimit() RateLimit {
	return RateLimit{Enabled: true, RulesBackend: "redis", DefaultGroup: "normal", Groups: defaultRateGroups(),
		Progressive: Progressive{Base: time.Hour, Max: 24 * time.Hour, History: 24 * time.Hour}}
}

func defaultDLQ() DLQ {
	return DLQ{EmergencyFile: "/var/lib/kfpipe/{daemon}-dlq-emergency.jsonl", ReplayInterval: 5 * time.Second,
		ProduceTimeout: 10 * time.Second, BreakerFailures: 5, BreakerOpen: 10 * time.Second}
}

// DefaultDedupLease is dedup.lease's default: a crashed consumer's claims
// free this long after its last renewal, so its users wait about the group
// session timeout (kafka.consumer.session_timeout, DefaultSessionTimeout)
// and not longer.
const DefaultDedupLease = 10 * time.Second

// DefaultStandbyAfterRedisLost is processor.standby_after_redis_lost's
// default: three dedup leases, so a blip (a Sentinel failover takes ~2 s)
// never churns the group, while a consumer cut off from Redis for longer
// hands its users to the members that can serve them.
const DefaultStandbyAfterRedisLost = 3 * DefaultDedupLease

func defaultConsumer(env string) Consumer {
	return Consumer{
		Common: defaultCommon(env, "consumer"),
		Processor: Processor{MailboxSize: 256, IdleTimeout: 2 * time.Minute, MaxInFlight: 20000, ResumeBelow: 10000,
			RetryAttempts: 3, RetryBase: 100 * time.Millisecond, RetryMax: 2 * time.Second, AttemptTimeout: 10 * time.Second,
			MaxMessageBytes: 1 << 20, PipelineFlush: time.Millisecond, PipelineMaxBatched: 256,
			// 1024 dead letters waiting per partition: four poll batches
			// (256), so one batch of refusals never pauses a partition
			// while the DLQ acknowledges in milliseconds, and a twentieth
			// of max_in_flight, so a slow DLQ pauses long before the
			// in-flight cap would. The letters are records already in
			// memory (counted by max_in_flight); waiting costs no more.
			DeadLetterQueue:       1024,
			StandbyAfterRedisLost: DefaultStandbyAfterRedisLost},
		Outage:    Outage{MinUsers: 10, FailureRatio: 0.8, Window: 30 * time.Second, Probes: 2, ProbeInterval: 5 * time.Second},
		Dedup:     Dedup{TTL: DefaultRecoveryTTL, Lease: DefaultDedupLease, Legacy: "read", Buckets: 1},
		RateLimit: DefaultRateLimit(),
		Breaker:   Breaker{FailureThreshold: 100, OpenTimeout: 30 * time.Second, HalfOpenMax: 5},
		Handler:   Handler{Type: "log", HTTP: HTTPHandler{Timeout: 5 * time.Second, MaxConns: 64}},
		DLQ:       defaultDLQ(),
		WeCom:     WeCom{BaseURL: "https://qyapi.weixin.qq.com", RequestTimeout: 5 * time.Second, PageLimit: 1000},
		Media:     defaultMedia(env),
		Recovery:  RetryHorizon{TTL: map[string]time.Duration{}, DefaultTTL: DefaultRecoveryTTL},
	}
}

// Validate reports every invalid key.
func (c *Consumer) Validate() error {
	v := &validator{}
	c.Common.validate(v)
	p := c.Processor
	v.between("processor.mailbox_size", p.MailboxSize, 1, 1<<20)
	v.durationBetween("processor.idle_timeout", p.IdleTimeout, 100*time.Millisecond, 24*time.Hour)
	v.atLeast("processor.max_in_flight", p.MaxInFlight, 1)
	v.between("processor.resume_below", p.ResumeBelow, 0, p.MaxInFlight-1)
	v.between("processor.retry_attempts", p.RetryAttempts, 1, 100)
	v.durationBetween("processor.retry_base", p.RetryBase, 0, time.Minute)
	v.durationBetween("processor.retry_max", p.RetryMax, p.RetryBase, time.Hour)
	v.durationBetween("processor.attempt_timeout", p.AttemptTimeout, time.Millisecond, time.Hour)
	v.between("processor.max_message_bytes", p.MaxMessageBytes, 1024, 100<<20)
	// Mapped onto the once client's batch: its bounds.
	v.durationBetween("processor.pipeline_flush", p.PipelineFlush, 0, state.MaxFlush)
	v.between("processor.pipeline_max_batched", p.PipelineMaxBatched, 1, state.MaxBatch)
	// Above processor.max_in_flight it never pauses: the in-flight cap,
	// which counts the same letters, pauses first.
	v.between("processor.dead_letter_queue", p.DeadLetterQueue, 1, 1<<20)
	if p.StandbyAfterRedisLost != 0 {
		v.durationBetween("processor.standby_after_redis_lost", p.StandbyAfterRedisLost, time.Second, time.Hour)
	}
	o := c.Outage
	v.between("outage.min_users", o.MinUsers, 0, 1_000_000)
	if o.FailureRatio <= 0 || o.FailureRatio > 1 {
		v.addf("outage.failure_ratio", "must be in (0, 1], got %g", o.FailureRatio)
	}
	v.durationBetween("outage.window", o.Window, time.Second, time.Hour)
	v.between("outage.probes", o.Probes, 1, 100)
	v.durationBetween("outage.probe_interval", o.ProbeInterval, 10*time.Millisecond, 10*time.Minute)
	// I3: WeChat may hand a message out again for 3 days.
	v.durationAtLeast("dedup.ttl", c.Dedup.TTL, 72*time.Hour)
	// Retention consistency: a letter the DLQ may still retry must find
	// the done mark its message got from a copy (issue #30, hole 6).
	horizon, from := c.Recovery.DefaultTTL, "recovery.default_ttl"
	for _, k := range sortedKeys(c.Recovery.TTL) {
		if d := c.Recovery.TTL[k]; d > horizon {
			horizon, from = d, "recovery.ttl."+k
		}
	}
	if c.Dedup.TTL < horizon {
		v.addf("dedup.ttl", "is %s, shorter than the DLQ's retry horizon (%s = %s): a letter retried after its message's done mark expired would run again; raise dedup.ttl to at least %s", c.Dedup.TTL, from, horizon, horizon)
	}
	// Stricter than the once client's own minimum (short leases are for
	// its tests): a claim renewed every lease/4 must survive a GC pause.
	v.durationBetween("dedup.lease", c.Dedup.Lease, time.Second, state.MaxLease)
	if c.Dedup.Store != "" {
		v.addf("dedup.store", "is set (%q), but there is one consumer-state store now (per partition) and no choice: delete the key; "+
			"a deployment of the claims or leases store switches as docs/operations.md says (\"Switching to the per-partition store\")", c.Dedup.Store)
	}
	v.oneOf("dedup.legacy", c.Dedup.Legacy, "off", "read")
	v.between("dedup.buckets", c.Dedup.Buckets, 1, 1<<16)
	c.RateLimit.validate(v, c.Coord.Enabled)
	b := c.Breaker
	v.atLeast("breaker.failure_threshold", b.FailureThreshold, 1)
	v.durationBetween("breaker.open_timeout", b.OpenTimeout, 10*time.Millisecond, 24*time.Hour)
	v.atLeast("breaker.half_open_max", b.HalfOpenMax, 1)
	v.oneOf("handler.type", c.Handler.Type, "log", "http", "noop")
	if c.Handler.Type == "http" {
		v.nonEmpty("handler.http.url", c.Handler.HTTP.URL)
	}
	if c.Handler.Type == "http" && c.Handler.HTTP.URL != "" {
		if u, err := url.Parse(c.Handler.HTTP.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.addf("handler.http.url", "must be an http(s) URL, got %q", c.Handler.HTTP.URL)
		}
	}
	v.durationBetween("handler.http.timeout", c.Handler.HTTP.Timeout, time.Millisecond, 5*time.Minute)
	v.between("handler.http.max_conns", c.Handler.HTTP.MaxConns, 1, 4096)
	c.DLQ.validate(v)
	// Replies (kfpipe.Reply) go through this client; its keys are checked
	// whether or not credentials are set.
	c.WeCom.validateClient(v)
	c.Media.validate(v)
	return v.err()
}

func (r RateLimit) validate(v *validator, coordEnabled bool) {
	r.validateGroups(v)
	v.oneOf("rate_limit.rules_backend", r.RulesBackend, "redis", "etcd")
	if r.RulesBackend == "etcd" && !coordEnabled {
		v.addf("rate_limit.rules_backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	if r.Progressive.Enabled {
		v.durationAtLeast("rate_limit.progressive.base", r.Progressive.Base, time.Second)
		v.durationAtLeast("rate_limit.progressive.max", r.Progressive.Max, r.Progressive.Base)
		v.durationAtLeast("rate_limit.progressive.history", r.Progressive.History, time.Minute)
	}
}

// Bounds of a rate-limit group; the limiter (package ratelimit) checks the
// rules it is given, at start and on a live change, with the same function
// (ValidateRateGroups).
const (
	MinWindowSeconds = 0.001
	MaxWindowSeconds = 7 * 86400.0
	MaxBlockHours    = 365 * 24.0
	maxRateCount     = math.MaxInt32
)

// ValidateRateGroups checks rate-limit groups and the default group's
// name, naming each bad key.
func ValidateRateGroups(groups map[string]RateGroup, defaultGroup string) error {
	v := &validator{}
	RateLimit{Groups: groups, DefaultGroup: defaultGroup}.validateGroups(v)
	return v.err()
}

func (r RateLimit) validateGroups(v *validator) {
	if _, ok := r.Groups[r.DefaultGroup]; !ok {
		v.addf("rate_limit.default_group", "must name a group in rate_limit.groups, got %q", r.DefaultGroup)
	}
	for _, n := range sortedKeys(r.Groups) {
		g, key := r.Groups[n], "rate_limit.groups."+n
		if n == "" {
			v.addf("rate_limit.groups", "has a group with an empty name")
		}
		if g.WindowSeconds < MinWindowSeconds || g.WindowSeconds > MaxWindowSeconds {
			v.addf(key+".window_seconds", "must be in [%g, %g], got %g", MinWindowSeconds, MaxWindowSeconds, g.WindowSeconds)
		}
		v.between(key+".max_messages", g.MaxMessages, 1, maxRateCount)
		v.between(key+".penalty_threshold", g.PenaltyThreshold, 1, maxRateCount)
		if g.BlockHours < 0 || g.BlockHours > MaxBlockHours {
			v.addf(key+".block_hours", "must be in [0, %g], got %g", MaxBlockHours, g.BlockHours)
		}
	}
}

func (d DLQ) validate(v *validator) {
	v.nonEmpty("dlq.emergency_file", d.EmergencyFile)
	v.durationBetween("dlq.replay_interval", d.ReplayInterval, 10*time.Millisecond, time.Hour)
	v.durationBetween("dlq.produce_timeout", d.ProduceTimeout, 100*time.Millisecond, 10*time.Minute)
	v.atLeast("dlq.breaker_failures", d.BreakerFailures, 1)
	v.durationBetween("dlq.breaker_open", d.BreakerOpen, 10*time.Millisecond, time.Hour)
}
