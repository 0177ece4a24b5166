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
	Env   string `mapstructure:"env"`
	Log   Log    `mapstructure:"log"`
	Ops   Ops    `mapstructure:"ops"`
	Kafka Kafka  `mapstructure:"kafka"`
	Redis Redis  `mapstructure:"redis"`
	Coord Coord  `mapstructure:"coord"`
}

// Coord is the etcd coordination section (internal/coord): the fleet
// registry, and the backend of idgen.allocator.backend: etcd. Off in
// development and test (the demo needs no etcd), on in production.
type Coord struct {
	Enabled            bool `mapstructure:"enabled"`
	coordconfig.Config `mapstructure:",squash"`
}

// Log configures the zap logger.
type Log struct {
	Level  string `mapstructure:"level"`  // debug|info|warn|error
	Format string `mapstructure:"format"` // json|console; empty = by env
}

// Ops configures the per-daemon operations HTTP server.
type Ops struct {
	// Addr is the listen address (default loopback: kf-producer
	// 127.0.0.1:9100, schedule-consumer :9101, dlq-consumer :9102).
	Addr string `mapstructure:"addr"`
	// Addrs sets the address per daemon in the shared file, by daemon name
	// (kf-producer, schedule-consumer, dlq-consumer); an entry replaces
	// Addr for that daemon unless KFPIPE_OPS_ADDR is set for the process.
	Addrs           map[string]string `mapstructure:"addrs"`
	Pprof           bool              `mapstructure:"pprof"`
	ShutdownTimeout time.Duration     `mapstructure:"shutdown_timeout"`
	ReadyTimeout    time.Duration     `mapstructure:"ready_timeout"`
}

// Kafka holds broker addresses, topics and client tuning.
type Kafka struct {
	Brokers  string        `mapstructure:"brokers"`
	ClientID string        `mapstructure:"client_id"`
	Topics   Topics        `mapstructure:"topics"`
	Producer KafkaProducer `mapstructure:"producer"`
	Consumer KafkaConsumer `mapstructure:"consumer"`
	// Overrides are extra librdkafka properties applied last (for TLS/SASL
	// and tuning we do not model); keys are librdkafka property names.
	Overrides map[string]string `mapstructure:"overrides"`
}

// Topics names the topics the pipeline uses.
type Topics struct {
	Main Topic `mapstructure:"main"`
	DLQ  Topic `mapstructure:"dlq"`
}

// Topic is a topic and the settings it is created with when missing.
type Topic struct {
	Name              string `mapstructure:"name"`
	Partitions        int    `mapstructure:"partitions"`
	ReplicationFactor int    `mapstructure:"replication_factor"`
	MinInsyncReplicas int    `mapstructure:"min_insync_replicas"`
	RetentionMs       int64  `mapstructure:"retention_ms"`
	CompressionType   string `mapstructure:"compression_type"`
	MaxMessageBytes   int    `mapstructure:"max_message_bytes"`
}

// KafkaProducer tunes the librdkafka producer. The safety settings
// (acks=all, idempotence) are not configurable: I1 depends on them.
type KafkaProducer struct {
	LingerMs     int    `mapstructure:"linger_ms"`
	BatchSize    int    `mapstructure:"batch_size"`
	QueueMaxMsgs int    `mapstructure:"queue_max_messages"`
	Compression  string `mapstructure:"compression"`
	// DeliveryTimeout bounds a message's delivery for the dead-letter
	// and replay producers. kf-producer's pages have none: a page is never
	// delivered with a hole (sync.delivery_wait bounds the wait instead).
	DeliveryTimeout time.Duration `mapstructure:"delivery_timeout"`
}

// KafkaConsumer tunes the librdkafka consumer. Manual commits and
// read_committed are not configurable: I2 depends on them.
type KafkaConsumer struct {
	GroupID          string        `mapstructure:"group_id"`
	SessionTimeout   time.Duration `mapstructure:"session_timeout"`
	MaxPollInterval  time.Duration `mapstructure:"max_poll_interval"`
	AutoOffsetReset  string        `mapstructure:"auto_offset_reset"`
	FetchMaxBytes    int           `mapstructure:"fetch_max_bytes"`
	CommitInterval   time.Duration `mapstructure:"commit_interval"`
	CommitEveryN     int           `mapstructure:"commit_every_n"`
	RevokeDrainLimit time.Duration `mapstructure:"revoke_drain_limit"`
}

// Redis configures the shared UniversalClient: a single node in
// development, Sentinel in production. Never Redis Cluster (locks).
type Redis struct {
	Mode          string   `mapstructure:"mode"` // single|sentinel|cluster
	Addr          string   `mapstructure:"addr"`
	MasterName    string   `mapstructure:"master_name"`
	SentinelAddrs []string `mapstructure:"sentinel_addrs"`
	// ClusterAddrs are the seed nodes of a Redis Cluster (redis.mode
	// cluster): any reachable one gives the client the slot map.
	ClusterAddrs []string      `mapstructure:"cluster_addrs"`
	DB           int           `mapstructure:"db"`
	Password     string        `mapstructure:"password"`
	KeyPrefix    string        `mapstructure:"key_prefix"`
	PoolSize     int           `mapstructure:"pool_size"`
	DialTimeout  time.Duration `mapstructure:"dial_timeout"`
	ReadTimeout  time.Duration `mapstructure:"read_timeout"`
	WriteTimeout time.Duration `mapstructure:"write_timeout"`
	// SkipEvictionPolicyCheck turns off the start-up check that Redis's
	// maxmemory-policy cannot evict kfpipe's keys, for a managed Redis
	// that hides CONFIG: the operator then vouches for noeviction.
	SkipEvictionPolicyCheck bool `mapstructure:"skip_eviction_policy_check"`
}

const week = 7 * 24 * time.Hour

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

func defaultCommon(env, daemon string) Common {
	main := Topic{Name: "qywx-chat-messages", Partitions: 4, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: week.Milliseconds(), CompressionType: "lz4", MaxMessageBytes: 1 << 20}
	dlq := Topic{Name: "qywx-dead-letter-queue", Partitions: 2, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: week.Milliseconds(), CompressionType: "lz4", MaxMessageBytes: 1 << 20}
	// Distinct ops ports per daemon, so one shared file runs all three on a
	// host; loopback unless a deployment says otherwise (the Kubernetes
	// manifests and systemd units do): /debug/pprof and /metrics are not
	// for the world.
	opsAddr := map[string]string{"producer": "127.0.0.1:9100", "consumer": "127.0.0.1:9101", "dlq": "127.0.0.1:9102"}[daemon]
	logFormat := "console"
	brokers := "127.0.0.1:9092"
	co := Coord{Config: coordconfig.DefaultConfig()}
	if env == EnvProduction {
		co.Enabled = true
		co.Endpoints = []string{"http://etcd1:2379", "http://etcd2:2379", "http://etcd3:2379"}
		main.Partitions, main.ReplicationFactor, main.MinInsyncReplicas = 12, 3, 2
		dlq.Partitions, dlq.ReplicationFactor, dlq.MinInsyncReplicas = 6, 3, 2
		logFormat = "json"
		brokers = "kafka1:9092,kafka2:9092,kafka3:9092"
	}
	return Common{
		Env: env,
		Log: Log{Level: "info", Format: logFormat},
		Ops: Ops{Addr: opsAddr, ShutdownTimeout: 8 * time.Second, ReadyTimeout: 2 * time.Second},
		Kafka: Kafka{
			Brokers:  brokers,
			ClientID: "kfpipe-" + daemon,
			Topics:   Topics{Main: main, DLQ: dlq},
			Producer: KafkaProducer{LingerMs: 5, BatchSize: 1 << 20, QueueMaxMsgs: 100000, Compression: "lz4",
				DeliveryTimeout: 30 * time.Second},
			Consumer: KafkaConsumer{GroupID: "kfpipe-" + daemon, SessionTimeout: DefaultSessionTimeout,
				MaxPollInterval: 5 * time.Minute, AutoOffsetReset: "earliest", FetchMaxBytes: 50 << 20,
				CommitInterval: time.Second, CommitEveryN: 1000, RevokeDrainLimit: 10 * time.Second},
			Overrides: map[string]string{},
		},
		Redis: Redis{Mode: "single", Addr: "127.0.0.1:6379", MasterName: "kfpipe", KeyPrefix: "kfpipe:",
			PoolSize: 64, DialTimeout: 2 * time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second},
		Coord: co,
	}
}

func (c Common) validate(v *validator) {
	v.oneOf("env", c.Env, EnvDevelopment, EnvTest, EnvProduction)
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "json", "console")
	v.nonEmpty("ops.addr", c.Ops.Addr)
	for name, addr := range c.Ops.Addrs {
		if !slices.Contains(Daemons, name) {
			v.addf("ops.addrs."+name, "is not a daemon (one of %s)", strings.Join(Daemons, ", "))
		}
		v.nonEmpty("ops.addrs."+name, addr)
	}
	v.durationBetween("ops.shutdown_timeout", c.Ops.ShutdownTimeout, time.Second, 5*time.Minute)
	v.durationBetween("ops.ready_timeout", c.Ops.ReadyTimeout, 100*time.Millisecond, time.Minute)
	c.Kafka.validate(v)
	c.Redis.validate(v)
	if c.Coord.Enabled {
		// coord's own rules; each error names its coord.* key.
		if err := c.Coord.Config.Validate(); err != nil {
			v.errs = append(v.errs, err)
		}
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
	p := k.Producer
	v.between("kafka.producer.linger_ms", p.LingerMs, 0, 1000)
	v.between("kafka.producer.batch_size", p.BatchSize, 1, 1<<30)
	v.between("kafka.producer.queue_max_messages", p.QueueMaxMsgs, 1, 10_000_000)
	v.oneOf("kafka.producer.compression", p.Compression, "none", "gzip", "snappy", "lz4", "zstd")
	v.durationAtLeast("kafka.producer.delivery_timeout", p.DeliveryTimeout, time.Second)
	c := k.Consumer
	v.nonEmpty("kafka.consumer.group_id", c.GroupID)
	v.durationBetween("kafka.consumer.session_timeout", c.SessionTimeout, time.Second, 5*time.Minute)
	v.durationAtLeast("kafka.consumer.max_poll_interval", c.MaxPollInterval, c.SessionTimeout)
	// latest is refused: when a group's committed offsets have expired
	// (offsets.retention.minutes) or the group is new on a topic that
	// already has records, it silently skips every record not yet read —
	// a loss I2 forbids.
	if c.AutoOffsetReset != "earliest" {
		v.addf("kafka.consumer.auto_offset_reset", "must be earliest, got %q: with %q a group whose committed offsets expired silently skips the records it has not read", c.AutoOffsetReset, c.AutoOffsetReset)
	}
	v.atLeast("kafka.consumer.fetch_max_bytes", c.FetchMaxBytes, 1024)
	v.durationBetween("kafka.consumer.commit_interval", c.CommitInterval, 10*time.Millisecond, time.Minute)
	v.atLeast("kafka.consumer.commit_every_n", c.CommitEveryN, 1)
	v.durationBetween("kafka.consumer.revoke_drain_limit", c.RevokeDrainLimit, 0, 5*time.Minute)
}

func (t Topic) validate(v *validator, key string) {
	v.nonEmpty(key+".name", t.Name)
	v.between(key+".partitions", t.Partitions, 1, 10000)
	v.between(key+".replication_factor", t.ReplicationFactor, 1, 16)
	v.between(key+".min_insync_replicas", t.MinInsyncReplicas, 1, t.ReplicationFactor)
	if t.RetentionMs < -1 || t.RetentionMs == 0 {
		v.addf(key+".retention_ms", "must be -1 (forever) or > 0, got %d", t.RetentionMs)
	}
	v.oneOf(key+".compression_type", t.CompressionType, "producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
	v.between(key+".max_message_bytes", t.MaxMessageBytes, 1024, 100<<20)
}

func (r Redis) validate(v *validator) {
	v.oneOf("redis.mode", r.Mode, "single", "sentinel", "cluster")
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
	v.between("redis.db", r.DB, 0, 15)
	v.between("redis.pool_size", r.PoolSize, 1, 10000)
	v.durationAtLeast("redis.dial_timeout", r.DialTimeout, 10*time.Millisecond)
	v.durationAtLeast("redis.read_timeout", r.ReadTimeout, 10*time.Millisecond)
	v.durationAtLeast("redis.write_timeout", r.WriteTimeout, 10*time.Millisecond)
}
