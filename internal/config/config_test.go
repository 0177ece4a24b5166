package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeYAML(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func repoConfig(name string) string { return filepath.Join("..", "..", "config", name) }

func TestShippedConfigsLoad(t *testing.T) {
	for _, f := range []string{"development.yaml", "test.yaml", "production.yaml"} {
		t.Run(f, func(t *testing.T) {
			// production.yaml takes its secrets from the environment.
			t.Setenv("KFPIPE_CALLBACK_TOKEN", "tok")
			t.Setenv("KFPIPE_CALLBACK_ENCODING_AES_KEY", strings.Repeat("a", 43))
			t.Setenv("KFPIPE_WECOM_CORP_ID", "corp")
			t.Setenv("KFPIPE_WECOM_SECRET", "secret")
			if _, err := LoadProducer(repoConfig(f)); err != nil {
				t.Errorf("producer: %v", err)
			}
			if _, err := LoadConsumer(repoConfig(f)); err != nil {
				t.Errorf("consumer: %v", err)
			}
			if _, err := LoadDLQConsumer(repoConfig(f)); err != nil {
				t.Errorf("dlq-consumer: %v", err)
			}
		})
	}
}

func TestEnvironmentTopicDefaults(t *testing.T) {
	cases := []struct {
		env                    string
		mainP, mainRF, mainISR int
		dlqP, dlqRF, dlqISR    int
	}{
		{EnvDevelopment, 4, 1, 1, 2, 1, 1},
		{EnvProduction, 12, 3, 2, 6, 3, 2},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv("KFPIPE_ENV", c.env)
			cfg, err := LoadConsumer("")
			if err != nil {
				t.Fatal(err)
			}
			m, d := cfg.Kafka.Topics.Main, cfg.Kafka.Topics.DLQ
			if m.Partitions != c.mainP || m.ReplicationFactor != c.mainRF || m.MinInsyncReplicas != c.mainISR {
				t.Errorf("main = %d/%d/%d, want %d/%d/%d", m.Partitions, m.ReplicationFactor, m.MinInsyncReplicas, c.mainP, c.mainRF, c.mainISR)
			}
			if d.Partitions != c.dlqP || d.ReplicationFactor != c.dlqRF || d.MinInsyncReplicas != c.dlqISR {
				t.Errorf("dlq = %d/%d/%d, want %d/%d/%d", d.Partitions, d.ReplicationFactor, d.MinInsyncReplicas, c.dlqP, c.dlqRF, c.dlqISR)
			}
			if m.Name != "qywx-chat-messages" || d.Name != "qywx-dead-letter-queue" || m.RetentionMs != 604800000 ||
				m.CompressionType != "lz4" || m.MaxMessageBytes != 1048576 {
				t.Errorf("main topic %+v", m)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	t.Setenv("KFPIPE_KAFKA_BROKERS", "10.0.0.1:9092,10.0.0.2:9092")
	t.Setenv("KFPIPE_PROCESSOR_MAILBOX_SIZE", "17")
	t.Setenv("KFPIPE_OPS_SHUTDOWN_TIMEOUT", "31s")
	t.Setenv("KFPIPE_REDIS_MODE", "sentinel")
	t.Setenv("KFPIPE_REDIS_SENTINEL_ADDRS", "s1:26379,s2:26379")
	p := writeYAML(t, "kafka:\n  brokers: file:9092\n")
	cfg, err := LoadConsumer(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.Brokers != "10.0.0.1:9092,10.0.0.2:9092" {
		t.Errorf("brokers = %q (env must win over file)", cfg.Kafka.Brokers)
	}
	if cfg.Processor.MailboxSize != 17 || cfg.Ops.ShutdownTimeout != 31*time.Second {
		t.Errorf("mailbox=%d shutdown=%s", cfg.Processor.MailboxSize, cfg.Ops.ShutdownTimeout)
	}
	if len(cfg.Redis.SentinelAddrs) != 2 || cfg.Redis.SentinelAddrs[1] != "s2:26379" {
		t.Errorf("sentinel addrs = %q", cfg.Redis.SentinelAddrs)
	}
}

// redis.mode cluster from the environment: the seeds are a comma list.
func TestRedisClusterFromEnv(t *testing.T) {
	t.Setenv("KFPIPE_REDIS_MODE", "cluster")
	t.Setenv("KFPIPE_REDIS_CLUSTER_ADDRS", "r0:6379,r1:6379,r2:6379")
	cfg, err := LoadConsumer(writeYAML(t, "kafka:\n  brokers: file:9092\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Mode != "cluster" || len(cfg.Redis.ClusterAddrs) != 3 || cfg.Redis.ClusterAddrs[2] != "r2:6379" {
		t.Errorf("redis %q %q", cfg.Redis.Mode, cfg.Redis.ClusterAddrs)
	}
}

func TestFileOverridesDefaults(t *testing.T) {
	p := writeYAML(t, `
rate_limit:
  groups:
    vip: {window_seconds: 10, max_messages: 30, penalty_threshold: 10, block_hours: 0.5}
processor:
  idle_timeout: 90s
`)
	cfg, err := LoadConsumer(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Processor.IdleTimeout != 90*time.Second {
		t.Errorf("idle_timeout = %s", cfg.Processor.IdleTimeout)
	}
	if g := cfg.RateLimit.Groups["vip"]; g.MaxMessages != 30 {
		t.Errorf("vip = %+v", g)
	}
	if g := cfg.RateLimit.Groups["normal"]; g.MaxMessages != 30 || g.PenaltyThreshold != 20 {
		t.Errorf("normal group lost its defaults: %+v", g)
	}
	if g := cfg.RateLimit.Groups["seed"]; g.MaxMessages != 5 || g.WindowSeconds != 10 || g.PenaltyThreshold != 3 || g.BlockHours != 1 {
		t.Errorf("seed group lost its defaults: %+v", g)
	}
}

func TestUnknownKeyRejected(t *testing.T) {
	p := writeYAML(t, "kafka:\n  brokerz: x:9092\nprocesor: {}\nprocessor:\n  mailbox_siz: 3\n")
	_, err := LoadConsumer(p)
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	for _, want := range []string{"unknown key", "kafka.brokerz", "procesor", "processor.mailbox_siz", "see docs/config.md for the keys"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestOtherDaemonsKeysAccepted(t *testing.T) {
	// One file serves all daemons: the consumer must accept admin keys.
	p := writeYAML(t, "admin:\n  addr: \":9999\"\ncallback:\n  path: /cb\n")
	if _, err := LoadConsumer(p); err != nil {
		t.Fatal(err)
	}
}

// TestValidationNamesKey: the rules of Validate's code, each error naming
// its key. A bound stated by a tag is checked for every key by
// TestEveryKeyRejectsOutOfRange instead.
func TestValidationNamesKey(t *testing.T) {
	cases := []struct {
		yaml string
		want string
	}{
		{"kafka:\n  topics:\n    main:\n      min_insync_replicas: 2\n", "kafka.topics.main.min_insync_replicas must be <= kafka.topics.main.replication_factor (1), got 2"},
		{"kafka:\n  topics:\n    dlq:\n      name: qywx-chat-messages\n", "kafka.topics.dlq.name must differ"},
		{"kafka:\n  brokers: \"\"\n", "kafka.brokers must not be empty"},
		{"kafka:\n  consumer:\n    group_id: \"\"\n", "kafka.consumer.group_id must not be empty"},
		{"kafka:\n  overrides:\n    acks: \"1\"\n", "kafka.overrides.acks may not be overridden"},
		{"redis:\n  mode: cluster\n", "redis.cluster_addrs must list at least one seed node"},
		{"redis:\n  mode: cluster\n  cluster_addrs: [\"a:1\"]\n  db: 2\n", "redis.db must be 0 when redis.mode is cluster"},
		{"redis:\n  mode: cluster\n  cluster_addrs: [\"a:1\"]\n  key_prefix: \"{kf}:\"\n", "redis.key_prefix must not contain '{' or '}' when redis.mode is cluster"},
		{"redis:\n  mode: sentinel\n", "redis.sentinel_addrs must list at least one sentinel"},
		{"processor:\n  resume_below: 50000\n", "processor.resume_below must be below processor.max_in_flight (20000), got 50000"},
		{"dedup:\n  ttl: 96h\n", "dedup.ttl is 96h0m0s, shorter than WeChat's re-pull window (72h0m0s) plus the DLQ's retry horizon (recovery.default_ttl = 168h0m0s)"},
		{"dedup:\n  ttl: 168h\n", "dedup.ttl is 168h0m0s, shorter than WeChat's re-pull window (72h0m0s) plus the DLQ's retry horizon (recovery.default_ttl = 168h0m0s)"},
		{"dedup:\n  ttl: 300h\nrecovery:\n  ttl:\n    downstream_error: 300h\n", "dedup.ttl is 300h0m0s, shorter than WeChat's re-pull window (72h0m0s) plus the DLQ's retry horizon (recovery.ttl.downstream_error = 300h0m0s)"},
		{"rate_limit:\n  default_group: gold\n", "rate_limit.default_group must name a group"},
		{"processor:\n  retry_base: 5s\n", "processor.retry_max must be >= processor.retry_base (5s), got 2s"},
		{"rate_limit:\n  progressive:\n    enabled: true\n    base: 2h\n    max: 1h\n", "rate_limit.progressive.max must be >= rate_limit.progressive.base (2h0m0s), got 1h0m0s"},
		{"kafka:\n  consumer:\n    session_timeout: 30s\n    max_poll_interval: 20s\n", "kafka.consumer.max_poll_interval must be >= kafka.consumer.session_timeout (30s), got 20s"},
		{"kafka:\n  consumer:\n    session_timeout: 6s\n    heartbeat_interval: 3s\n", "kafka.consumer.heartbeat_interval must be at most a third of kafka.consumer.session_timeout (6s), got 3s"},
		{"handler:\n  type: http\n", "handler.http.url must not be empty"},
		{"env: staging\n", "env must be one of development|test|production, got \"staging\""},
		{"kafka:\n  consumer:\n    auto_offset_reset: latest\n", "kafka.consumer.auto_offset_reset must be earliest, got \"latest\""},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := LoadConsumer(writeYAML(t, c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestProducerValidation(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"callback:\n  token: \"\"\n", "callback.token must not be empty"},
		{"callback:\n  encoding_aes_key: short\n", "callback.encoding_aes_key must be 43 characters, got 5"},
		{"callback:\n  path: cb\n", "callback.path must start with /"},
		{"idgen:\n  datacenter_id: 3\n  allocator:\n    max_id: 100\n", "idgen.allocator.max_id must be in [1, 32] when idgen.datacenter_id is set, got 100"},
		{"idgen:\n  allocator:\n    backend: etcd\n", "idgen.allocator.backend is etcd, which needs coord.enabled: true"},
		{"sync:\n  lock:\n    backend: etcd\n", "sync.lock.backend is etcd, which needs coord.enabled: true"},
		{"idgen:\n  epoch: yesterday\n", "idgen.epoch must be an RFC 3339 time"},
		{"idgen:\n  sequencer:\n    step: 10\n    max_value: 5\n", "idgen.sequencer.max_value must be 0 (no wrap) or >= idgen.sequencer.step (10), got 5"},
		// The sequencer counts in Redis Lua, exact up to 2^53 only.
		{"idgen:\n  sequencer:\n    max_value: 9007199254740993\n", "idgen.sequencer.max_value must be in [0, 9007199254740992], got 9007199254740993"},
		{"idgen:\n  sequencer:\n    step: 9007199254740993\n", "idgen.sequencer.step must be in [1, 9007199254740992], got 9007199254740993"},
		{"idgen:\n  sequencer:\n    driver: etcd\n", "idgen.sequencer.driver must be one of redis"},
		{"sync:\n  retry_base: 1m\n  retry_max: 30s\n", "sync.retry_max must be >= sync.retry_base (1m0s), got 30s"},
	}
	base := "callback:\n  token: t\n  encoding_aes_key: " + strings.Repeat("k", 43) + "\nwecom:\n  corp_id: c\n  secret: s\n"
	if _, err := LoadProducer(writeYAML(t, base)); err != nil {
		t.Fatalf("base config invalid: %v", err)
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := LoadProducer(writeYAML(t, mergeYAML(base, c.yaml)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestDLQConsumerValidation(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"admin:\n  tokens:\n    - {name: a, token: short, role: operator}\n", "admin.tokens[0].token must be at least 16 characters"},
		{"admin:\n  tokens:\n    - {name: a, token: 0123456789abcdef, role: operator}\n    - {name: a, token: 0123456789abcdeg, role: viewer}\n", "admin.tokens[1].name \"a\" is used twice"},
		{"admin:\n  tokens:\n    - {name: a, token: 0123456789abcdef, role: operator}\n    - {name: b, token: 0123456789abcdef, role: viewer}\n", "admin.tokens[1].token is used twice"},
		{"admin:\n  tokens:\n    - {name: a, token: 0123456789abcdef, role: admin}\n", "admin.tokens[0].role must be one of viewer|operator"},
		{"admin:\n  batch_rate: 0\n", "admin.batch_rate must be"},
		{"admin:\n  max_body_bytes: 10\n", "admin.max_body_bytes must be"},
		{"recovery:\n  max_delay: 1s\n", "recovery.max_delay must be >= recovery.base_delay (1m0s), got 1s"},
		{"recovery:\n  scan_interval: 30s\n  lock_ttl: 10s\n", "recovery.lock_ttl must be >= recovery.scan_interval (30s), got 10s"},
		// The index reads letters back from the topic: it may not keep
		// them longer than the topic does.
		{"recovery:\n  ttl:\n    queue_full: 192h\n", "recovery.ttl.queue_full 192h0m0s is longer than kafka.topics.dlq.retention_ms (168h0m0s)"},
		{"kafka:\n  topics:\n    dlq:\n      retention_ms: 86400000\n", "recovery.default_ttl 168h0m0s is longer than kafka.topics.dlq.retention_ms (24h0m0s)"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := LoadDLQConsumer(writeYAML(t, c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestAllErrorsReportedAtOnce(t *testing.T) {
	_, err := LoadConsumer(writeYAML(t, "processor:\n  mailbox_size: 0\nbreaker:\n  half_open_max: 0\n"))
	if err == nil || !strings.Contains(err.Error(), "processor.mailbox_size") || !strings.Contains(err.Error(), "breaker.half_open_max") {
		t.Fatalf("want both keys named, got %v", err)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := LoadConsumer(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}

// mergeYAML appends overrides to a base document; later top-level sections
// are merged by key so the test reads naturally.
func mergeYAML(base, extra string) string {
	sections := map[string][]string{}
	var order []string
	for _, doc := range []string{base, extra} {
		var cur string
		for _, line := range strings.Split(doc, "\n") {
			if line == "" {
				continue
			}
			if line[0] != ' ' {
				cur = line
				if _, ok := sections[cur]; !ok {
					order = append(order, cur)
					sections[cur] = nil
				}
				continue
			}
			key := strings.SplitN(strings.TrimSpace(line), ":", 2)[0]
			replaced := false
			for i, old := range sections[cur] {
				if strings.SplitN(strings.TrimSpace(old), ":", 2)[0] == key && !strings.HasSuffix(old, ":") {
					sections[cur][i], replaced = line, true
				}
			}
			if !replaced {
				sections[cur] = append(sections[cur], line)
			}
		}
	}
	var b strings.Builder
	for _, s := range order {
		b.WriteString(s + "\n")
		for _, l := range sections[s] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestAdminTokensFromEnv(t *testing.T) {
	t.Setenv("KFPIPE_ADMIN_TOKENS", "ops:operator:0123456789abcdef01, dash:viewer:fedcba9876543210fe")
	cfg, err := LoadDLQConsumer("")
	if err != nil {
		t.Fatal(err)
	}
	want := []AdminToken{{Name: "ops", Role: "operator", Token: "0123456789abcdef01"}, {Name: "dash", Role: "viewer", Token: "fedcba9876543210fe"}}
	if len(cfg.Admin.Tokens) != 2 || cfg.Admin.Tokens[0] != want[0] || cfg.Admin.Tokens[1] != want[1] {
		t.Fatalf("tokens = %+v", cfg.Admin.Tokens)
	}
	t.Setenv("KFPIPE_ADMIN_TOKENS", "ops:operator")
	_, err = LoadDLQConsumer("")
	if err == nil || !strings.Contains(err.Error(), "admin.tokens") {
		t.Fatalf("malformed tokens: %v", err)
	}
	t.Setenv("KFPIPE_ADMIN_TOKENS", "ops:root:0123456789abcdef01")
	if _, err = LoadDLQConsumer(""); err == nil || !strings.Contains(err.Error(), "admin.tokens[0].role must be one of viewer|operator") || strings.Contains(err.Error(), "0123456789abcdef01") {
		t.Fatalf("bad role: %v", err)
	}
}

// TestEmergencyFilePerDaemon: "{daemon}" in dlq.emergency_file gives each
// daemon its own file from one shared config (the file is locked: two
// processes on one path would refuse to start).
func TestEmergencyFilePerDaemon(t *testing.T) {
	path := writeYAML(t, "dlq:\n  emergency_file: /var/lib/kfpipe/{daemon}-dlq.jsonl\n")
	c, err := LoadConsumer(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDLQConsumer(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.DLQ.EmergencyFile != "/var/lib/kfpipe/schedule-consumer-dlq.jsonl" || d.DLQ.EmergencyFile != "/var/lib/kfpipe/dlq-consumer-dlq.jsonl" {
		t.Fatalf("emergency files %q and %q", c.DLQ.EmergencyFile, d.DLQ.EmergencyFile)
	}
}

// TestListenAddressesDefaultToLoopback: the ops, admin and callback servers
// listen on loopback unless the file or the environment says otherwise,
// pprof is off, and ops.addrs sets one daemon's ops address in the shared
// file.
func TestListenAddressesDefaultToLoopback(t *testing.T) {
	t.Setenv("KFPIPE_CALLBACK_TOKEN", "tok")
	t.Setenv("KFPIPE_CALLBACK_ENCODING_AES_KEY", strings.Repeat("a", 43))
	t.Setenv("KFPIPE_WECOM_CORP_ID", "ww")
	t.Setenv("KFPIPE_WECOM_SECRET", "s")
	p, err := LoadProducer("")
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadConsumer("")
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDLQConsumer("")
	if err != nil {
		t.Fatal(err)
	}
	for name, addr := range map[string]string{"kf-producer ops": p.Ops.Addr, "schedule-consumer ops": c.Ops.Addr,
		"dlq-consumer ops": d.Ops.Addr, "callback": p.Callback.Addr, "admin": d.Admin.Addr} {
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("%s listens on %q by default, want loopback", name, addr)
		}
	}
	if p.Ops.Pprof || c.Ops.Pprof || d.Ops.Pprof {
		t.Error("pprof on by default")
	}
	dev, err := LoadConsumer("../../config/development.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if dev.Ops.Pprof {
		t.Error("pprof on in config/development.yaml")
	}
	path := writeYAML(t, "ops:\n  addrs:\n    schedule-consumer: \":9201\"\n")
	if c, err := LoadConsumer(path); err != nil || c.Ops.Addr != ":9201" {
		t.Fatalf("ops.addrs.schedule-consumer: %v %v", c, err)
	}
	if p, err := LoadProducer(path); err != nil || p.Ops.Addr != "127.0.0.1:9100" {
		t.Fatalf("kf-producer took another daemon's address: %v", err)
	}
	if _, err := LoadConsumer(writeYAML(t, "ops:\n  addrs:\n    schedule-consumr: \":9201\"\n")); err == nil ||
		!strings.Contains(err.Error(), "ops.addrs.schedule-consumr is not a daemon") {
		t.Fatalf("misspelt daemon in ops.addrs: %v", err)
	}
}

// TestShutdownLeavesTheDrain: with the shipped defaults a stop can await
// its handlers for the whole kafka.consumer.revoke_drain_limit and still
// hand over and leave the fleet (issue 43); a shutdown_timeout that leaves
// less is refused, naming the key.
func TestShutdownLeavesTheDrain(t *testing.T) {
	cfg, err := LoadConsumer(writeYAML(t, "kafka:\n  brokers: k:9092\n"))
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if got, need := cfg.Ops.ShutdownTimeout, cfg.Kafka.Consumer.RevokeDrainLimit+StopReserve; got < need {
		t.Fatalf("default ops.shutdown_timeout %s < revoke_drain_limit + StopReserve = %s", got, need)
	}
	_, err = LoadConsumer(writeYAML(t, "kafka:\n  brokers: k:9092\nops:\n  shutdown_timeout: 15s\n"))
	if err == nil || !strings.Contains(err.Error(), "ops.shutdown_timeout is 15s") {
		t.Fatalf("shutdown_timeout 15s with a 10s drain limit: %v, want an error naming ops.shutdown_timeout", err)
	}
	if _, err := LoadConsumer(writeYAML(t, "kafka:\n  brokers: k:9092\n  consumer:\n    revoke_drain_limit: 5s\nops:\n  shutdown_timeout: 15s\n")); err != nil {
		t.Fatalf("shutdown_timeout 15s with a 5s drain limit: %v", err)
	}
}
