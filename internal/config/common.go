package config

import (
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord/coordconfig"
)

// Environments. The environment picks topic defaults (partitions,
// replication, retention; docs/operations.md "Topic sizing") and the log
// format.
const (
	EnvDevelopment = "development"
	EnvTest        = "test"
	EnvProduction  = "production"
)

// Common holds the sections every daemon has.
type Common struct {
	// Env picks the environment's defaults: topic sizing, log format,
	// brokers, coord (docs/operations.md, "Topic sizing").
	Env   string `mapstructure:"env" default:"development" enum:"development|test|production"`
	Log   Log    `mapstructure:"log"`
	Ops   Ops    `mapstructure:"ops"`
	Kafka Kafka  `mapstructure:"kafka"`
	Redis Redis  `mapstructure:"redis"`
	Coord Coord  `mapstructure:"coord"`
}

// Coord is the etcd coordination section (internal/coord): the fleet
// registry, and the backend of idgen.allocator.backend: etcd. Off in
// development and test (the demo needs no etcd), on in production; its
// keys are checked only when it is on.
type Coord struct {
	// coordconfig.Config's Validate, promoted to Coord, makes the generic
	// bounds check leave the section to it; Common.validate calls it when
	// the section is enabled.

	// Enabled connects to etcd at start (and waits for it); production
	// defaults to true.
	Enabled            bool `mapstructure:"enabled"`
	coordconfig.Config `mapstructure:",squash"`
}

// Log configures the zap logger.
type Log struct {
	// Level is the lowest level logged.
	Level string `mapstructure:"level" default:"info" enum:"debug|info|warn|error"`
	// Format is json (one object a line, for collectors) or console (for
	// people); production defaults to json.
	Format string `mapstructure:"format" default:"console" enum:"json|console"`
}

// Ops configures the per-daemon operations HTTP server (/metrics,
// /healthz, /readyz, /debug/pprof).
type Ops struct {
	// Addr is the listen address: loopback by default, a port per daemon,
	// so one host runs all three.
	Addr string `mapstructure:"addr"`
	// Addrs sets the address per daemon in the shared file, by daemon name
	// (kf-producer, schedule-consumer, dlq-consumer); an entry replaces
	// Addr for that daemon unless KFPIPE_OPS_ADDR is set for the process.
	Addrs map[string]string `mapstructure:"addrs"`
	// Pprof serves /debug/pprof on the ops port; off unless asked for.
	Pprof bool `mapstructure:"pprof"`
	// ShutdownTimeout bounds a graceful stop after SIGTERM (drain, flush,
	// commit); keep it below the orchestrator's kill grace period. A
	// schedule-consumer needs at least kafka.consumer.revoke_drain_limit
	// plus 8 s (StopReserve), so that a stop under load awaits its handlers for
	// the whole drain limit, hands its partitions over and leaves the
	// fleet before the deadline.
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout" default:"25s" range:"[1s, 5m]"`
	// ReadyTimeout bounds each dependency probe of /readyz.
	ReadyTimeout time.Duration `mapstructure:"ready_timeout" default:"2s" range:"[100ms, 1m]"`
}

// Kafka holds broker addresses, topics and client tuning.
type Kafka struct {
	// Brokers is the bootstrap list, host:port comma-separated.
	Brokers string `mapstructure:"brokers"`
	// ClientID names the daemon to the brokers (quotas, logs).
	ClientID string        `mapstructure:"client_id"`
	Topics   Topics        `mapstructure:"topics"`
	Producer KafkaProducer `mapstructure:"producer"`
	Consumer KafkaConsumer `mapstructure:"consumer"`
	// Overrides are extra librdkafka properties applied last (for TLS/SASL
	// and tuning we do not model); keys are librdkafka property names. The
	// ones the delivery guarantees rest on (acks, enable.idempotence,
	// enable.auto.commit, enable.auto.offset.store, isolation.level,
	// partitioner) are refused.
	Overrides map[string]string `mapstructure:"overrides"`
}

// Topics names the topics the pipeline uses.
type Topics struct {
	// Main is the topic kf-producer writes customers' messages to and the
	// schedule-consumer reads.
	Main Topic `mapstructure:"main"`
	// DLQ is the dead-letter topic: the consumers write, the dlq-consumer
	// reads, indexes and re-injects.
	DLQ Topic `mapstructure:"dlq"`
}

// Topic is a topic and the settings it is created with when missing
// (docs/operations.md, "Topic sizing"); an existing topic is not altered.
type Topic struct {
	// Name is the topic's name; the two topics' must differ.
	Name string `mapstructure:"name"`
	// Partitions bounds the consumers that share the work; production
	// defaults to 12 (main) and 6 (dlq).
	Partitions int `mapstructure:"partitions" range:"[1, 10000]"`
	// ReplicationFactor is the copies of each partition; 1 on a single
	// broker, production defaults to 3.
	ReplicationFactor int `mapstructure:"replication_factor" range:"[1, 16]"`
	// MinInsyncReplicas is the copies a write waits for (acks=all), at
	// most replication_factor; production defaults to 2.
	MinInsyncReplicas int `mapstructure:"min_insync_replicas" range:"[1,]"`
	// RetentionMs is how long the topic keeps records, in milliseconds;
	// -1 keeps them forever.
	RetentionMs int64 `mapstructure:"retention_ms" default:"604800000"`
	// CompressionType is the topic's compression.type.
	CompressionType string `mapstructure:"compression_type" default:"lz4" enum:"producer|uncompressed|gzip|snappy|lz4|zstd"`
	// MaxMessageBytes is the topic's max.message.bytes: the largest record
	// batch it accepts.
	MaxMessageBytes int `mapstructure:"max_message_bytes" default:"1048576" range:"[1024, 104857600]"`
}

// KafkaProducer tunes the librdkafka producer. The safety settings
// (acks=all, idempotence) are not configurable: I1 depends on them.
type KafkaProducer struct {
	// LingerMs is how long the producer waits to fill a batch.
	LingerMs int `mapstructure:"linger_ms" default:"5" range:"[0, 1000]"`
	// BatchSize is the largest batch in bytes.
	BatchSize int `mapstructure:"batch_size" default:"1048576" range:"[1, 1073741824]"`
	// QueueMaxMsgs bounds the records waiting in the producer's queue.
	QueueMaxMsgs int `mapstructure:"queue_max_messages" default:"100000" range:"[1, 10_000_000]"`
	// Compression is the producer's compression codec.
	Compression string `mapstructure:"compression" default:"lz4" enum:"none|gzip|snappy|lz4|zstd"`
	// DeliveryTimeout bounds a message's delivery for the dead-letter
	// and replay producers. kf-producer's pages have none: a page is never
	// delivered with a hole (sync.delivery_wait bounds the wait instead).
	DeliveryTimeout time.Duration `mapstructure:"delivery_timeout" default:"30s" range:"[1s,]"`
}

// KafkaConsumer tunes the librdkafka consumer. Manual commits and
// read_committed are not configurable: I2 depends on them.
type KafkaConsumer struct {
	// GroupID is the daemon's consumer group.
	GroupID string `mapstructure:"group_id"`
	// SessionTimeout is how long the group waits for a silent member
	// before it hands its partitions to the others.
	SessionTimeout time.Duration `mapstructure:"session_timeout" default:"DefaultSessionTimeout" range:"[1s, 5m]"`
	// HeartbeatInterval is how often the member tells the group it is
	// alive, and so how soon it learns that a rebalance began: a rolling
	// restart is a few rebalances, each waiting for every member's next
	// heartbeat (a cooperative one twice). At most a third of
	// session_timeout.
	HeartbeatInterval time.Duration `mapstructure:"heartbeat_interval" default:"1s" range:"[100ms, 1m]"`
	// MaxPollInterval is the longest gap between polls before the member
	// is considered stuck and leaves the group; at least session_timeout.
	MaxPollInterval time.Duration `mapstructure:"max_poll_interval" default:"5m"`
	// AutoOffsetReset is where a group without a committed offset starts;
	// only earliest (latest would skip records, a loss I2 forbids).
	AutoOffsetReset string `mapstructure:"auto_offset_reset" default:"earliest"`
	// FetchMaxBytes bounds one fetch response.
	FetchMaxBytes int `mapstructure:"fetch_max_bytes" default:"52428800" range:"[1024,]"`
	// CommitInterval is how often processed offsets are committed ...
	CommitInterval time.Duration `mapstructure:"commit_interval" default:"1s" range:"[10ms, 1m]"`
	// CommitEveryN ... or after this many records, whichever is first.
	CommitEveryN int `mapstructure:"commit_every_n" default:"1000" range:"[1,]"`
	// RevokeDrainLimit bounds how long a revoked (or, on a stop, every)
	// partition's running handler attempts are awaited before they are
	// cancelled; its lease is given back only once they ended (0: cancelled
	// at once).
	RevokeDrainLimit time.Duration `mapstructure:"revoke_drain_limit" default:"10s" range:"[0, 5m]"`
}

// Redis configures the shared UniversalClient: a single node in
// development, Sentinel in production, or a Redis Cluster.
type Redis struct {
	// Mode is single (addr), sentinel (master_name, sentinel_addrs) or
	// cluster (cluster_addrs).
	Mode string `mapstructure:"mode" default:"single" enum:"single|sentinel|cluster"`
	// Addr is the server of redis.mode single, host:port.
	Addr string `mapstructure:"addr" default:"127.0.0.1:6379"`
	// MasterName is the Sentinel master's name (redis.mode sentinel).
	MasterName string `mapstructure:"master_name" default:"kfpipe"`
	// SentinelAddrs are the Sentinels, host:port (redis.mode sentinel).
	SentinelAddrs []string `mapstructure:"sentinel_addrs"`
	// ClusterAddrs are the seed nodes of a Redis Cluster (redis.mode
	// cluster): any reachable one gives the client the slot map.
	ClusterAddrs []string `mapstructure:"cluster_addrs"`
	// DB is the database number (0 in cluster mode).
	DB int `mapstructure:"db" range:"[0, 15]"`
	// Password authenticates to Redis (and the Sentinels); from the
	// environment (KFPIPE_REDIS_PASSWORD) rather than the file.
	Password string `mapstructure:"password"`
	// KeyPrefix starts every key kfpipe writes, so a shared Redis (or two
	// deployments) never mix keys; no braces in cluster mode (a hash tag
	// would put every key in one slot).
	KeyPrefix string `mapstructure:"key_prefix" default:"kfpipe:"`
	// PoolSize bounds the client's connections.
	PoolSize int `mapstructure:"pool_size" default:"64" range:"[1, 10000]"`
	// DialTimeout bounds connecting.
	DialTimeout time.Duration `mapstructure:"dial_timeout" default:"2s" range:"[10ms,]"`
	// ReadTimeout bounds reading a reply.
	ReadTimeout time.Duration `mapstructure:"read_timeout" default:"1s" range:"[10ms,]"`
	// WriteTimeout bounds writing a command.
	WriteTimeout time.Duration `mapstructure:"write_timeout" default:"1s" range:"[10ms,]"`
	// SkipEvictionPolicyCheck turns off the start-up check that Redis's
	// maxmemory-policy cannot evict kfpipe's keys, for a managed Redis
	// that hides CONFIG: the operator then vouches for noeviction.
	SkipEvictionPolicyCheck bool `mapstructure:"skip_eviction_policy_check"`
}

// Daemons are the daemons' names, as ops.addrs and "{daemon}" in
// dlq.emergency_file spell them.
var Daemons = []string{"kf-producer", "schedule-consumer", "dlq-consumer"}

// forDaemon applies what the shared file sets per daemon to name's
// configuration.
func (c *Common) forDaemon(name string) {
	if a, ok := c.Ops.Addrs[name]; ok && os.Getenv(EnvPrefix+"_OPS_ADDR") == "" {
		c.Ops.Addr = a
	}
}

// DefaultSessionTimeout is kafka.consumer.session_timeout's default.
const DefaultSessionTimeout = 10 * time.Second

// defaultCommon is the common sections' defaults: the tags', then what
// depends on the environment or the daemon (short name producer,
// consumer or dlq), which a tag cannot say.
func defaultCommon(c *Common, env, daemon string) {
	c.Env = env
	main, dlq := &c.Kafka.Topics.Main, &c.Kafka.Topics.DLQ
	main.Name, dlq.Name = "qywx-chat-messages", "qywx-dead-letter-queue"
	main.Partitions, main.ReplicationFactor, main.MinInsyncReplicas = 4, 1, 1
	dlq.Partitions, dlq.ReplicationFactor, dlq.MinInsyncReplicas = 2, 1, 1
	// Distinct ops ports per daemon, so one shared file runs all three on a
	// host; loopback unless a deployment says otherwise (the Kubernetes
	// manifests and systemd units do): /debug/pprof and /metrics are not
	// for the world.
	c.Ops.Addr = map[string]string{"producer": "127.0.0.1:9100", "consumer": "127.0.0.1:9101", "dlq": "127.0.0.1:9102"}[daemon]
	c.Kafka.Brokers = "127.0.0.1:9092"
	c.Kafka.ClientID = "kfpipe-" + daemon
	c.Kafka.Consumer.GroupID = "kfpipe-" + daemon
	c.Kafka.Overrides = map[string]string{}
	c.Coord.Config = coordconfig.DefaultConfig()
	if env == EnvProduction {
		c.Coord.Enabled = true
		c.Coord.Endpoints = []string{"http://etcd1:2379", "http://etcd2:2379", "http://etcd3:2379"}
		main.Partitions, main.ReplicationFactor, main.MinInsyncReplicas = 12, 3, 2
		dlq.Partitions, dlq.ReplicationFactor, dlq.MinInsyncReplicas = 6, 3, 2
		c.Log.Format = "json"
		c.Kafka.Brokers = "kafka1:9092,kafka2:9092,kafka3:9092"
	}
}

func (c Common) validate(v *validator) {
	v.nonEmpty("ops.addr", c.Ops.Addr)
	for name, addr := range c.Ops.Addrs {
		if !slices.Contains(Daemons, name) {
			v.addf("ops.addrs."+name, "is not a daemon (one of %s)", strings.Join(Daemons, ", "))
		}
		v.nonEmpty("ops.addrs."+name, addr)
	}
	c.Kafka.validate(v)
	c.Redis.validate(v)
	if c.Coord.Enabled {
		// coord's own rules; each error names its coord.* key.
		v.addErr(c.Coord.Config.Validate())
	}
}

func (k Kafka) validate(v *validator) {
	v.nonEmpty("kafka.brokers", k.Brokers)
	v.nonEmpty("kafka.client_id", k.ClientID)
	k.Topics.Main.validate(v, "kafka.topics.main")
	k.Topics.DLQ.validate(v, "kafka.topics.dlq")
	if k.Topics.Main.Name != "" && k.Topics.Main.Name == k.Topics.DLQ.Name {
		v.addf("kafka.topics.dlq.name", "must differ from kafka.topics.main.name, both are %q", k.Topics.DLQ.Name)
	}
	for _, key := range sortedKeys(k.Overrides) {
		switch key {
		case "acks", "enable.idempotence", "enable.auto.commit", "enable.auto.offset.store", "isolation.level", "partitioner":
			v.addf("kafka.overrides."+key, "may not be overridden: the delivery guarantees depend on it")
		}
	}
	c := k.Consumer
	v.nonEmpty("kafka.consumer.group_id", c.GroupID)
	if 3*c.HeartbeatInterval > c.SessionTimeout {
		v.addf("kafka.consumer.heartbeat_interval", "must be at most a third of kafka.consumer.session_timeout (%s), got %s", c.SessionTimeout, c.HeartbeatInterval)
	}
	if c.MaxPollInterval < c.SessionTimeout {
		v.addf("kafka.consumer.max_poll_interval", "must be >= kafka.consumer.session_timeout (%s), got %s", c.SessionTimeout, c.MaxPollInterval)
	}
	// latest is refused: when a group's committed offsets have expired
	// (offsets.retention.minutes) or the group is new on a topic that
	// already has records, it silently skips every record not yet read —
	// a loss I2 forbids.
	if c.AutoOffsetReset != "earliest" {
		v.addf("kafka.consumer.auto_offset_reset", "must be earliest, got %q: with %q a group whose committed offsets expired silently skips the records it has not read", c.AutoOffsetReset, c.AutoOffsetReset)
	}
}

func (t Topic) validate(v *validator, key string) {
	v.nonEmpty(key+".name", t.Name)
	if t.MinInsyncReplicas > t.ReplicationFactor {
		v.addf(key+".min_insync_replicas", "must be <= %s.replication_factor (%d), got %d", key, t.ReplicationFactor, t.MinInsyncReplicas)
	}
	if t.RetentionMs < -1 || t.RetentionMs == 0 {
		v.addf(key+".retention_ms", "must be -1 (forever) or > 0, got %d", t.RetentionMs)
	}
}

func (r Redis) validate(v *validator) {
	switch r.Mode {
	case "single":
		v.nonEmpty("redis.addr", r.Addr)
	case "sentinel":
		v.nonEmpty("redis.master_name", r.MasterName)
		if len(r.SentinelAddrs) == 0 {
			v.addf("redis.sentinel_addrs", "must list at least one sentinel when redis.mode is sentinel")
		}
		for i, a := range r.SentinelAddrs {
			v.nonEmpty("redis.sentinel_addrs["+itoa(i)+"]", a)
		}
	case "cluster":
		if len(r.ClusterAddrs) == 0 {
			v.addf("redis.cluster_addrs", "must list at least one seed node (host:port) when redis.mode is cluster")
		}
		for i, a := range r.ClusterAddrs {
			if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
				v.addf("redis.cluster_addrs["+itoa(i)+"]", "must be host:port, got %q", a)
			}
		}
		// A brace in the prefix would be the hash tag of every key: the
		// whole deployment on one slot, and kfpipe's own tags ignored.
		if strings.ContainsAny(r.KeyPrefix, "{}") {
			v.addf("redis.key_prefix", "must not contain '{' or '}' when redis.mode is cluster (it would put every key in one hash slot), got %q", r.KeyPrefix)
		}
		// A Redis Cluster has database 0 only.
		if r.DB != 0 {
			v.addf("redis.db", "must be 0 when redis.mode is cluster (a Redis Cluster has database 0 only), got %d", r.DB)
		}
	}
	// Every key of kfpipe is under it: a Redis shared with anything else
	// (or two deployments) would mix keys without one.
	v.nonEmpty("redis.key_prefix", r.KeyPrefix)
}
