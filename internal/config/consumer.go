package config

import (
	"math"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
	"github.com/kfpipe/kfpipe/internal/state"
)

// Consumer is the schedule-consumer daemon's configuration.
type Consumer struct {
	Common    `mapstructure:",squash"`
	Processor Processor `mapstructure:"processor"`
	Outage    Outage    `mapstructure:"outage"`
	Overload  Overload  `mapstructure:"overload"`
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
	// Archive is where handlers read the conversation's earlier turns
	// (kfpipe.History); the dlq-consumer's archiver fills it.
	Archive Archive `mapstructure:"archive"`
}

// RetryHorizon is the part of the dlq-consumer's recovery section the
// schedule-consumer checks dedup.ttl against: how long a letter stays
// retryable, per reason and by default. Its keys, defaults and bounds are
// Recovery's (the dlq-consumer's, which checks them).
type RetryHorizon struct {
	TTL        map[string]time.Duration `mapstructure:"ttl"`
	DefaultTTL time.Duration            `mapstructure:"default_ttl"`
}

// DefaultRecoveryTTL is recovery.default_ttl's default: a letter stays
// retryable a week.
const DefaultRecoveryTTL = 7 * 24 * time.Hour

// Processor configures per-user actors and per-partition flow control.
type Processor struct {
	// MailboxSize is how many messages a user's actor holds waiting; one
	// more is dead-lettered as queue_full.
	MailboxSize int `mapstructure:"mailbox_size" default:"256" range:"[1, 1048576]"`
	// IdleTimeout stops a user's actor after this long without messages
	// (a new message starts it again).
	IdleTimeout time.Duration `mapstructure:"idle_timeout" default:"2m" range:"[100ms, 24h]"`
	// MaxInFlight is how many records of one partition may be in flight
	// (read, not yet done) before the partition is paused ...
	MaxInFlight int `mapstructure:"max_in_flight" default:"20000" range:"[1,]"`
	// ResumeBelow ... and how few resume it; below max_in_flight.
	ResumeBelow int `mapstructure:"resume_below" default:"10000" range:"[0,]"`
	// RetryAttempts is how many times the handler is called for a message
	// before it is dead-lettered (downstream_error, process_timeout).
	RetryAttempts int `mapstructure:"retry_attempts" default:"3" range:"[1, 100]"`
	// RetryBase is the first wait between two attempts, doubled each time
	// up to retry_max.
	RetryBase time.Duration `mapstructure:"retry_base" default:"100ms" range:"[0, 1m]"`
	// RetryMax bounds the wait between two attempts; at least retry_base.
	RetryMax time.Duration `mapstructure:"retry_max" default:"2s" range:"[0, 1h]"`
	// AttemptTimeout bounds one handler call (the handler's context).
	AttemptTimeout time.Duration `mapstructure:"attempt_timeout" default:"10s" range:"[1ms, 1h]"`
	// MaxMessageBytes is the largest record handled; a larger one is
	// dead-lettered as invalid_message.
	MaxMessageBytes int `mapstructure:"max_message_bytes" default:"1048576" range:"[1024, 104857600]"`
	// PipelineFlush is how long the consumer-state store gathers Redis
	// commands (done marks, look-ups) into one round trip; 0 flushes at
	// once.
	PipelineFlush time.Duration `mapstructure:"pipeline_flush" default:"1ms" range:"[0, state.MaxFlush]"`
	// PipelineMaxBatched flushes a batch that reaches this many commands
	// before pipeline_flush.
	PipelineMaxBatched int `mapstructure:"pipeline_max_batched" default:"256" range:"[1, state.MaxBatch]"`
	// DeadLetterQueue is how many dead letters of one partition may wait
	// for their durable DLQ write before the partition is paused (it
	// resumes below half of it): a slow DLQ then holds back only the
	// partitions that dead-letter, never the poll goroutine (I5, I6).
	//
	// 1024 by default: four poll batches (256), so one batch of refusals
	// never pauses a partition while the DLQ acknowledges in
	// milliseconds, and a twentieth of max_in_flight, so a slow DLQ
	// pauses long before the in-flight cap would (above max_in_flight it
	// never pauses: the in-flight cap, which counts the same letters,
	// pauses first). The letters are records already in memory (counted
	// by max_in_flight); waiting costs no more.
	DeadLetterQueue int `mapstructure:"dead_letter_queue" default:"1024" range:"[1, 1048576]"`
	// StandbyAfterRedisLost: a consumer whose Redis has been unreachable
	// this long leaves its group (its partitions go to members that still
	// have Redis) and joins again once Redis answers; 0 never leaves.
	StandbyAfterRedisLost time.Duration `mapstructure:"standby_after_redis_lost" default:"DefaultStandbyAfterRedisLost" range:"[1s, 1h]" zero:"never leaves"`
}

// Outage configures the consumer's downstream health gate: when the
// handler fails for many users at once, messages wait (a few probe the
// downstream) instead of being dead-lettered (docs/operations.md).
type Outage struct {
	// MinUsers distinct users with a retryable failure within window open
	// the gate (0 turns it off) ...
	MinUsers int `mapstructure:"min_users" default:"10" range:"[0, 1_000_000]"`
	// FailureRatio ... when failures are at least this share of the
	// attempts.
	FailureRatio float64 `mapstructure:"failure_ratio" default:"0.8" range:"(0, 1]"`
	// Window is the span over which failing users and the ratio are
	// counted.
	Window time.Duration `mapstructure:"window" default:"30s" range:"[1s, 1h]"`
	// Probes is how many handler calls may run at a time while the gate
	// is open ...
	Probes int `mapstructure:"probes" default:"2" range:"[1, 100]"`
	// ProbeInterval ... one started every this long.
	ProbeInterval time.Duration `mapstructure:"probe_interval" default:"5s" range:"[10ms, 10m]"`
}

// Overload configures the bound on the handler's calls in flight and on
// its retries, so that a slow downstream gets fewer calls, not more
// (docs/operations.md, "A slow downstream").
type Overload struct {
	// MaxInFlight bounds the handler calls in flight on one consumer; the
	// adaptive limit moves between 1 and it (with handler.type http, also
	// at most handler.http.max_conns). A message beyond the limit waits in
	// its actor. 0 turns the limit off (every call goes at once, as
	// before the limit; for comparing its cost, or a handler that bounds
	// its own calls).
	MaxInFlight int `mapstructure:"max_in_flight" default:"1024" range:"[0, 1_000_000]" zero:"no limit"`
	// InitialLimit is the limit before the downstream's latency is known.
	// The limit grows one call a round trip: a handler that takes seconds
	// (an LLM bot) needs it near the calls it carries at once (rate ×
	// mean latency), docs/handlers.md.
	InitialLimit int `mapstructure:"initial_limit" default:"10" range:"[1, 1_000_000]"`
	// Tolerance: when the shortest call of windows of at least 24 calls
	// exceeds this many times the downstream's baseline latency (its
	// shortest call), the downstream is queueing our calls and the limit
	// is cut by a quarter; otherwise a window that used the limit raises
	// it by one call a round trip.
	Tolerance float64 `mapstructure:"tolerance" default:"1.3" range:"(1, 10]"`
	// RetryBudget bounds retries to this share of first calls (each first
	// call earns this much of a retry, retry_floor a second always go); a
	// retry beyond it waits. 0 turns the budget off.
	RetryBudget float64 `mapstructure:"retry_budget" default:"0.5" range:"[0, 100]" zero:"retries not bounded"`
	// RetryFloor is the retries a second the budget lets go on one
	// consumer even with no first calls. When most traffic fails (many
	// users' downstream broken), it paces their messages to the DLQ: each
	// takes processor.retry_attempts - 1 retries (docs/operations.md, "A
	// slow downstream").
	RetryFloor float64 `mapstructure:"retry_floor" default:"5" range:"[0.1, 10_000]"`
}

// Dedup configures the idempotency keys (I3): the consumer-state store's
// section, owned by package state (its keys, defaults and bounds).
type Dedup = state.Settings

// RateLimit configures the per-user sliding-window limiter (package
// ratelimit; docs/operations.md, "The rate limiter's rules").
type RateLimit struct {
	// Enabled turns the limiter on; off, every message passes.
	Enabled bool `mapstructure:"enabled" default:"true"`
	// RulesBackend is where the operators' rules override and per-user
	// group assignments live: redis (rl:rules, changes announced on Redis
	// pub/sub) or etcd (coord's config center, followed by a watch; needs
	// coord.enabled). Blocks stay in Redis either way.
	RulesBackend string `mapstructure:"rules_backend" default:"redis" enum:"redis|etcd"`
	// DefaultGroup is the group of a user assigned to none; it must be
	// one of groups.
	DefaultGroup string `mapstructure:"default_group" default:"normal"`
	// Groups are the window rules by group name; a file's group replaces
	// the shipped one of that name and keeps the others.
	Groups map[string]RateGroup `mapstructure:"groups"`
	// Progressive lengthens the block of a user blocked again.
	Progressive Progressive `mapstructure:"progressive"`
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

// RateGroup is one group's window rule.
type RateGroup struct {
	// WindowSeconds is the sliding window's length, in seconds ...
	WindowSeconds float64 `mapstructure:"window_seconds" range:"[MinWindowSeconds, MaxWindowSeconds]"`
	// MaxMessages ... and how many messages a user may send within it;
	// one more is refused (rate_limited).
	MaxMessages int `mapstructure:"max_messages" range:"[1, maxRateCount]"`
	// PenaltyThreshold is how many refusals, before the window drains to
	// half, block the user ...
	PenaltyThreshold int `mapstructure:"penalty_threshold" range:"[1, maxRateCount]"`
	// BlockHours ... for this many hours (0: refusals never block).
	BlockHours float64 `mapstructure:"block_hours" range:"[0, MaxBlockHours]"`
}

// Progressive configures the optional escalating block: its keys are
// checked only when it is enabled.
type Progressive struct {
	// Enabled makes each new block of a user within history longer.
	Enabled bool `mapstructure:"enabled"`
	// Base is the first escalated block ...
	Base time.Duration `mapstructure:"base" default:"1h" range:"[1s,]"`
	// Max ... doubled each time up to this; at least base.
	Max time.Duration `mapstructure:"max" default:"24h" range:"[1s,]"`
	// History is how long a block counts toward the next one.
	History time.Duration `mapstructure:"history" default:"24h" range:"[1m,]"`
}

// BoundsApply reports whether the section's bounds are checked: only
// while it is enabled.
func (p Progressive) BoundsApply() bool { return p.Enabled }

// Breaker configures the per-user circuit breaker.
type Breaker struct {
	// FailureThreshold is how many consecutive failed messages of a user
	// open the user's breaker (its messages are then dead-lettered as
	// circuit_open) ...
	FailureThreshold int `mapstructure:"failure_threshold" default:"100" range:"[1,]"`
	// OpenTimeout ... for this long, after which it is half-open.
	OpenTimeout time.Duration `mapstructure:"open_timeout" default:"30s" range:"[10ms, 24h]"`
	// HalfOpenMax is how many trial messages a half-open breaker admits
	// at a time.
	HalfOpenMax int `mapstructure:"half_open_max" default:"5" range:"[1,]"`
}

// Handler selects the business handler.
type Handler struct {
	// Type is log (logs each message), http (posts it to handler.http.url)
	// or noop; a program built on the kfpipe package brings its own.
	Type string      `mapstructure:"type" default:"log" enum:"log|http|noop"`
	HTTP HTTPHandler `mapstructure:"http"`
}

// HTTPHandler posts each message to a URL (docs/handler-protocol.md).
type HTTPHandler struct {
	// URL receives each message (http or https); required with
	// handler.type http.
	URL string `mapstructure:"url"`
	// Timeout bounds one request from when it is sent: the receiver did
	// not answer in time (a wait for a connection does not count).
	Timeout time.Duration `mapstructure:"timeout" default:"5s" range:"[1ms, 5m]"`
	// MaxConns caps the connections (and so the requests in flight) to
	// the receiver; that many are kept alive between messages. Actors
	// beyond it wait for a connection, bounded by the attempt's timeout.
	MaxConns int `mapstructure:"max_conns" default:"64" range:"[1, 4096]"`
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
	// EmergencyFile is where a dead letter goes when the DLQ topic cannot
	// take it (an fsync'd append; replayed to the topic later); "{daemon}"
	// is replaced by the daemon's name, so one shared file serves every
	// daemon.
	EmergencyFile string `mapstructure:"emergency_file" default:"/var/lib/kfpipe/{daemon}-dlq-emergency.jsonl"`
	// ReplayInterval is how often the emergency file is replayed to the
	// DLQ topic.
	ReplayInterval time.Duration `mapstructure:"replay_interval" default:"5s" range:"[10ms, 1h]"`
	// ProduceTimeout bounds one dead letter's write to the DLQ topic
	// before it goes to the emergency file.
	ProduceTimeout time.Duration `mapstructure:"produce_timeout" default:"10s" range:"[100ms, 10m]"`
	// BreakerFailures is how many failed DLQ writes in a row open the DLQ
	// producer's breaker (letters go straight to the emergency file) ...
	BreakerFailures int `mapstructure:"breaker_failures" default:"5" range:"[1,]"`
	// BreakerOpen ... for this long before a write is tried again.
	BreakerOpen time.Duration `mapstructure:"breaker_open" default:"10s" range:"[10ms, 1h]"`
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
	r := RateLimit{Groups: defaultRateGroups()}
	names.SetDefaults(&r)
	return r
}

// DefaultDedupLease is dedup.lease's default, the store's own: a crashed
// consumer's claims free this long after its last renewal, so its users
// wait about the group session timeout (kafka.consumer.session_timeout,
// DefaultSessionTimeout) and not longer.
const DefaultDedupLease = state.DefaultLease

// DefaultStandbyAfterRedisLost is processor.standby_after_redis_lost's
// default: three dedup leases, so a blip (a Sentinel failover takes ~2 s)
// never churns the group, while a consumer cut off from Redis for longer
// hands its users to the members that can serve them.
const DefaultStandbyAfterRedisLost = 3 * DefaultDedupLease

func defaultConsumer(env string) Consumer {
	var c Consumer
	defaultCommon(&c.Common, env, "consumer")
	c.RateLimit.Groups = defaultRateGroups()
	c.Media.Dir = defaultMediaDir(env)
	names.SetDefaults(&c)
	r := defaultDLQConsumer(env).Recovery
	c.Recovery = RetryHorizon{TTL: r.TTL, DefaultTTL: r.DefaultTTL}
	return c
}

// StopReserve is what a schedule-consumer's stop needs after its drain
// (kafka.consumer.revoke_drain_limit): the cancelled handler attempts'
// wait (2 s), the Kafka group's leave (up to 5 s) and the fleet's leave.
// ops.shutdown_timeout must leave it.
const StopReserve = 8 * time.Second

// Validate reports every invalid key.
func (c *Consumer) Validate() error {
	v := &validator{}
	v.bounds(c)
	c.Common.validate(v)
	c.Archive.validate(v)
	p := c.Processor
	if p.ResumeBelow >= p.MaxInFlight {
		v.addf("processor.resume_below", "must be below processor.max_in_flight (%d), got %d", p.MaxInFlight, p.ResumeBelow)
	}
	if p.RetryMax < p.RetryBase {
		v.addf("processor.retry_max", "must be >= processor.retry_base (%s), got %s", p.RetryBase, p.RetryMax)
	}
	// The horizon's keys are recovery's: checked by that section's tags.
	r := defaultDLQConsumer(c.Env).Recovery
	r.TTL, r.DefaultTTL = c.Recovery.TTL, c.Recovery.DefaultTTL
	v.boundsAt("recovery", r)
	// Retention consistency: a letter the DLQ may still retry must find
	// the done mark its message got from a copy (issue #30, hole 6).
	horizon, from := c.Recovery.DefaultTTL, "recovery.default_ttl"
	for _, k := range sortedKeys(c.Recovery.TTL) {
		if d := c.Recovery.TTL[k]; d > horizon {
			horizon, from = d, "recovery.ttl."+k
		}
	}
	// A copy re-pulled up to 3 days after its message was handled and
	// dead-lettered without a look-up (refused) stays retryable a horizon
	// from its own failure (issue 43): the mark must outlive both.
	if need := state.MinTTL + horizon; c.Dedup.TTL < need {
		v.addf("dedup.ttl", "is %s, shorter than WeChat's re-pull window (%s) plus the DLQ's retry horizon (%s = %s): a copy re-pulled on day 3 and dead-lettered stays retryable a horizon from its own failure, and would run again once its message's done mark expired; raise dedup.ttl to at least %s",
			c.Dedup.TTL, state.MinTTL, from, horizon, need)
	}
	// A stop awaits the running handlers up to the drain limit, then needs
	// StopReserve for the rest (issue 43): with less, it cancels them early.
	if need := c.Kafka.Consumer.RevokeDrainLimit + StopReserve; c.Ops.ShutdownTimeout < need {
		v.addf("ops.shutdown_timeout", "is %s, shorter than kafka.consumer.revoke_drain_limit (%s) plus the %s the rest of a stop needs (the cancelled handlers' wait, the group's leave, the fleet's leave): a SIGTERM under load would cancel its handlers before the drain limit or be cut off before it left the fleet; raise ops.shutdown_timeout to at least %s or lower kafka.consumer.revoke_drain_limit",
			c.Ops.ShutdownTimeout, c.Kafka.Consumer.RevokeDrainLimit, StopReserve, need)
	}
	// The tags (package state's) bound the dedup keys; store is read
	// only to refuse it.
	if c.Dedup.Store != "" {
		v.addf("dedup.store", "is set (%q), but there is one consumer-state store now (per partition) and no choice: delete the key; "+
			"a deployment of the claims or leases store switches as docs/operations.md says (\"Switching to the per-partition store\")", c.Dedup.Store)
	}
	c.RateLimit.validate(v, c.Coord.Enabled)
	if c.Handler.Type == "http" {
		v.nonEmpty("handler.http.url", c.Handler.HTTP.URL)
	}
	if c.Handler.Type == "http" && c.Handler.HTTP.URL != "" {
		if !schema.IsHTTPURL(c.Handler.HTTP.URL) {
			v.addf("handler.http.url", "must be an http(s) URL, got %q", c.Handler.HTTP.URL)
		}
	}
	c.DLQ.validate(v)
	// Replies (kfpipe.Reply) go through this client; its keys are checked
	// whether or not credentials are set.
	c.WeCom.validateClient(v)
	c.Media.validate(v)
	return v.err()
}

func (r RateLimit) validate(v *validator, coordEnabled bool) {
	r.validateGroups(v)
	if r.RulesBackend == "etcd" && !coordEnabled {
		v.addf("rate_limit.rules_backend", "is etcd, which needs coord.enabled: true (the etcd of the coord section)")
	}
	if r.Progressive.Enabled && r.Progressive.Max < r.Progressive.Base {
		v.addf("rate_limit.progressive.max", "must be >= rate_limit.progressive.base (%s), got %s", r.Progressive.Base, r.Progressive.Max)
	}
}

// ValidateRateGroups checks rate-limit groups and the default group's
// name, naming each bad key.
func ValidateRateGroups(groups map[string]RateGroup, defaultGroup string) error {
	v := &validator{}
	v.boundsAt("rate_limit", struct {
		Groups map[string]RateGroup `mapstructure:"groups"`
	}{groups})
	RateLimit{Groups: groups, DefaultGroup: defaultGroup}.validateGroups(v)
	return v.err()
}

// validateGroups checks what the groups' tags cannot: the default group
// names one, and no name is empty.
func (r RateLimit) validateGroups(v *validator) {
	if _, ok := r.Groups[r.DefaultGroup]; !ok {
		v.addf("rate_limit.default_group", "must name a group in rate_limit.groups, got %q", r.DefaultGroup)
	}
	if _, ok := r.Groups[""]; ok {
		v.addf("rate_limit.groups", "has a group with an empty name")
	}
}

func (d DLQ) validate(v *validator) {
	v.nonEmpty("dlq.emergency_file", d.EmergencyFile)
}
