package config

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// daemons that read a key: p kf-producer, c schedule-consumer, d dlq-consumer.
const (
	rP = 1 << iota
	rC
	rD
	rAll = rP | rC | rD
)

// outOfRange is, for every key the loader knows, a value Validate must
// refuse, and the daemons that read it. A key whose every value is valid
// (a flag, a password) says why instead. TestEveryKeyRejectsOutOfRange
// fails when a key of the schema is missing here, so a new setting cannot
// be added without its bound.
var outOfRange = map[string]struct {
	bad     any
	readBy  int
	anyOK   string // why every value is valid
	wantKey string // the key the error names, when it is not the key itself
}{
	"env":                              {bad: "staging", readBy: rAll},
	"log.level":                        {bad: "verbose", readBy: rAll},
	"log.format":                       {bad: "xml", readBy: rAll},
	"ops.addr":                         {bad: " ", readBy: rAll},
	"ops.addrs":                        {bad: map[string]string{"kf-consumer": "127.0.0.1:1"}, readBy: rAll, wantKey: "ops.addrs.kf-consumer"},
	"ops.pprof":                        {anyOK: "a flag"},
	"redis.skip_eviction_policy_check": {anyOK: "a flag (checked against the server at start-up)"},
	"ops.shutdown_timeout":             {bad: "10m", readBy: rAll},
	"ops.ready_timeout":                {bad: "1ms", readBy: rAll},

	"kafka.brokers":                         {bad: " ", readBy: rAll},
	"kafka.topics.main.name":                {bad: " ", readBy: rAll},
	"kafka.topics.main.partitions":          {bad: 0, readBy: rAll},
	"kafka.topics.main.replication_factor":  {bad: 17, readBy: rAll},
	"kafka.topics.main.min_insync_replicas": {bad: 9, readBy: rAll},
	"kafka.topics.main.retention_ms":        {bad: -5, readBy: rAll},
	"kafka.topics.main.compression_type":    {bad: "brotli", readBy: rAll},
	"kafka.topics.main.max_message_bytes":   {bad: 10, readBy: rAll},
	"kafka.topics.dlq.name":                 {bad: " ", readBy: rAll},
	"kafka.topics.dlq.partitions":           {bad: 0, readBy: rAll},
	"kafka.topics.dlq.replication_factor":   {bad: 17, readBy: rAll},
	"kafka.topics.dlq.min_insync_replicas":  {bad: 9, readBy: rAll},
	"kafka.topics.dlq.retention_ms":         {bad: -5, readBy: rAll},
	"kafka.topics.dlq.compression_type":     {bad: "brotli", readBy: rAll},
	"kafka.topics.dlq.max_message_bytes":    {bad: 10, readBy: rAll},
	"kafka.client_id":                       {bad: " ", readBy: rAll},
	"kafka.overrides":                       {bad: map[string]string{"acks": "1"}, readBy: rAll, wantKey: "kafka.overrides.acks"},
	"kafka.producer.batch_size":             {bad: 0, readBy: rAll},
	"kafka.producer.compression":            {bad: "brotli", readBy: rAll},
	"kafka.producer.delivery_timeout":       {bad: "10ms", readBy: rAll},
	"kafka.producer.linger_ms":              {bad: 5000, readBy: rAll},
	"kafka.producer.queue_max_messages":     {bad: 0, readBy: rAll},
	"kafka.consumer.auto_offset_reset":      {bad: "latest", readBy: rAll},
	"kafka.consumer.commit_every_n":         {bad: 0, readBy: rAll},
	"kafka.consumer.commit_interval":        {bad: "2m", readBy: rAll},
	"kafka.consumer.fetch_max_bytes":        {bad: 10, readBy: rAll},
	"kafka.consumer.group_id":               {bad: " ", readBy: rAll},
	"kafka.consumer.max_poll_interval":      {bad: "1s", readBy: rAll},
	"kafka.consumer.revoke_drain_limit":     {bad: "10m", readBy: rAll},
	"kafka.consumer.session_timeout":        {bad: "10m", readBy: rAll},

	"redis.addr": {bad: " ", readBy: rAll},

	"coord.enabled":        {anyOK: "a flag (the section is checked when it is on)"},
	"coord.endpoints":      {bad: []string{"ftp://x:1"}, readBy: rAll, wantKey: "coord.endpoints[0]"},
	"coord.dial_timeout":   {bad: "1ms", readBy: rAll},
	"coord.keep_alive":     {bad: "10ms", readBy: rAll},
	"coord.namespace":      {bad: "kfpipe", readBy: rAll},
	"coord.username":       {bad: "ops", readBy: rAll}, // without a password
	"coord.password":       {bad: "secret", readBy: rAll, wantKey: "coord.username"},
	"coord.tls.cert_file":  {bad: "/nonexistent/cert.pem", readBy: rAll},
	"coord.tls.key_file":   {bad: "/nonexistent/key.pem", readBy: rAll},
	"coord.tls.ca_file":    {bad: "/nonexistent/ca.pem", readBy: rAll},
	"redis.db":             {bad: 16, readBy: rAll},
	"redis.dial_timeout":   {bad: "1ms", readBy: rAll},
	"redis.key_prefix":     {bad: " ", readBy: rAll},
	"redis.master_name":    {bad: " ", readBy: rAll},
	"redis.mode":           {bad: "shard", readBy: rAll},
	"redis.cluster_addrs":  {bad: []string{"no-port"}, readBy: rAll, wantKey: "redis.cluster_addrs[0]"},
	"redis.password":       {anyOK: "any password (or none) is a valid password"},
	"redis.pool_size":      {bad: 0, readBy: rAll},
	"redis.read_timeout":   {bad: "1ms", readBy: rAll},
	"redis.sentinel_addrs": {bad: []string{" "}, readBy: rAll, wantKey: "redis.sentinel_addrs[0]"},
	"redis.write_timeout":  {bad: "1ms", readBy: rAll},

	"callback.addr":             {bad: " ", readBy: rP},
	"callback.encoding_aes_key": {bad: "short", readBy: rP},
	"callback.max_body_bytes":   {bad: 10, readBy: rP},
	"callback.path":             {bad: "no-slash", readBy: rP},
	"callback.replay_window":    {bad: "1ms", readBy: rP},
	"callback.timestamp_window": {bad: "25h", readBy: rP},
	"callback.token":            {bad: " ", readBy: rP},

	"wecom.base_url":         {bad: "ftp://x", readBy: rP | rC},
	"wecom.corp_id":          {bad: " ", readBy: rP},
	"wecom.open_kfids":       {bad: []string{" "}, readBy: rP, wantKey: "wecom.open_kfids[0]"},
	"wecom.deny_open_kfids":  {bad: []string{" "}, readBy: rP, wantKey: "wecom.deny_open_kfids[0]"},
	"wecom.accounts_refresh": {bad: "-1s", readBy: rP},
	"wecom.page_limit":       {bad: 5000, readBy: rP},
	"wecom.request_timeout":  {bad: "-1s", readBy: rP | rC},
	"wecom.secret":           {bad: " ", readBy: rP},

	"sync.delivery_wait":   {bad: "11m", readBy: rP},
	"sync.lock.backend":    {bad: "zookeeper", readBy: rP},
	"sync.lock_ttl":        {bad: "1ms", readBy: rP},
	"sync.retry_base":      {bad: "0s", readBy: rP},
	"sync.retry_max":       {bad: "1ms", readBy: rP},
	"sync.safety_interval": {bad: "25h", readBy: rP},
	"sync.workers":         {bad: 0, readBy: rP},

	"idgen.allocator.backend":   {bad: "zookeeper", readBy: rP},
	"idgen.allocator.max_id":    {bad: 5000, readBy: rP},
	"idgen.allocator.ttl":       {bad: "1ms", readBy: rP},
	"idgen.datacenter_id":       {bad: 99, readBy: rP},
	"idgen.epoch":               {bad: "2999-01-01T00:00:00Z", readBy: rP},
	"idgen.sequencer.driver":    {bad: "mysql", readBy: rP},
	"idgen.sequencer.max_value": {bad: -1, readBy: rP},
	"idgen.sequencer.step":      {bad: 0, readBy: rP},
	"idgen.sequencer.ttl":       {bad: "1ms", readBy: rP},

	"processor.attempt_timeout":          {bad: "0s", readBy: rC},
	"processor.dead_letter_queue":        {bad: 0, readBy: rC},
	"processor.idle_timeout":             {bad: "1ms", readBy: rC},
	"processor.mailbox_size":             {bad: 0, readBy: rC},
	"processor.max_in_flight":            {bad: 0, readBy: rC},
	"processor.max_message_bytes":        {bad: 10, readBy: rC},
	"processor.pipeline_flush":           {bad: "500ms", readBy: rC},
	"processor.standby_after_redis_lost": {bad: "10ms", readBy: rC},
	"processor.pipeline_max_batched":     {bad: 50000, readBy: rC},
	"processor.resume_below":             {bad: 1 << 30, readBy: rC},
	"processor.retry_attempts":           {bad: 0, readBy: rC},
	"processor.retry_base":               {bad: "2m", readBy: rC},
	"processor.retry_max":                {bad: "2h", readBy: rC},
	"outage.min_users":                   {bad: -1, readBy: rC},
	"outage.failure_ratio":               {bad: 1.5, readBy: rC},
	"outage.window":                      {bad: "100ms", readBy: rC},
	"outage.probes":                      {bad: 0, readBy: rC},
	"outage.probe_interval":              {bad: "1h", readBy: rC},
	"dedup.lease":                        {bad: "10ms", readBy: rC},
	"dedup.ttl":                          {bad: "1h", readBy: rC},
	"dedup.store":                        {bad: "claims", readBy: rC},
	"dedup.legacy":                       {bad: "write", readBy: rC},
	"dedup.buckets":                      {bad: "0", readBy: rC},
	"breaker.failure_threshold":          {bad: 0, readBy: rC},
	"breaker.half_open_max":              {bad: 0, readBy: rC},
	"breaker.open_timeout":               {bad: "1ms", readBy: rC},
	"handler.type":                       {bad: "grpc", readBy: rC},
	"handler.http.max_conns":             {bad: 0, readBy: rC},
	"handler.http.secret":                {anyOK: "any secret (or none: unsigned) is valid"},
	"handler.http.timeout":               {bad: "10m", readBy: rC},
	"handler.http.url":                   {bad: "not a url", readBy: rC},

	"rate_limit.default_group":       {bad: "nosuch", readBy: rC | rD},
	"rate_limit.enabled":             {anyOK: "a flag"},
	"rate_limit.rules_backend":       {bad: "zookeeper", readBy: rC | rD},
	"rate_limit.groups":              {bad: map[string]any{"g": map[string]any{"window_seconds": 0, "max_messages": 1, "penalty_threshold": 1}}, readBy: rC | rD, wantKey: "rate_limit.groups.g.window_seconds"},
	"rate_limit.progressive.base":    {bad: "1ms", readBy: rC | rD},
	"rate_limit.progressive.enabled": {anyOK: "a flag (its durations are checked when it is on)"},
	"rate_limit.progressive.history": {bad: "1s", readBy: rC | rD},
	"rate_limit.progressive.max":     {bad: "1s", readBy: rC | rD},

	"dlq.breaker_failures": {bad: 0, readBy: rC | rD},
	"dlq.breaker_open":     {bad: "1ms", readBy: rC | rD},
	"dlq.emergency_file":   {bad: " ", readBy: rC | rD},
	"dlq.produce_timeout":  {bad: "1ms", readBy: rC | rD},
	"dlq.replay_interval":  {bad: "1ms", readBy: rC | rD},

	"recovery.base_delay":    {bad: "0s", readBy: rD},
	"recovery.default_ttl":   {bad: "1s", readBy: rD},
	"recovery.lock_ttl":      {bad: "1h", readBy: rD},
	"recovery.max_delay":     {bad: "1ms", readBy: rD},
	"recovery.max_retries":   {bad: map[string]int{"rate_limted": 3}, readBy: rD, wantKey: "recovery.max_retries.rate_limted"},
	"recovery.scan_interval": {bad: "1ms", readBy: rD},
	"recovery.ttl":           {bad: map[string]string{"rate_limited": "1s"}, readBy: rD, wantKey: "recovery.ttl.rate_limited"},

	"dlq_index.max_entries": {bad: 10, readBy: rD},

	"admin.addr":           {bad: " ", readBy: rD},
	"admin.max_body_bytes": {bad: 10, readBy: rD},
	"admin.consumer_group": {bad: " ", readBy: rD},
	"admin.batch_rate":     {bad: 0, readBy: rD},
	"admin.tokens":         {bad: []map[string]string{{"name": "x", "token": "short", "role": "viewer"}}, readBy: rD, wantKey: "admin.tokens[0].token"},

	"media.store":         {bad: "ftp", readBy: rP | rC},
	"media.dir":           {bad: " ", readBy: rP | rC},
	"media.max_bytes":     {bad: 10, readBy: rP | rC},
	"media.retries":       {bad: 50, readBy: rP | rC},
	"media.retry_base":    {bad: "1ms", readBy: rP | rC},
	"media.workers":       {bad: 0, readBy: rP | rC},
	"media.queue_size":    {bad: 0, readBy: rP | rC},
	"media.s3.endpoint":   {bad: "http://127.0.0.1:1", readBy: rP | rC},
	"media.s3.bucket":     {bad: "Bad_Bucket", readBy: rP | rC},
	"media.s3.region":     {anyOK: "any region name (S3-compatible servers use their own)"},
	"media.s3.access_key": {bad: "key-without-secret", readBy: rP | rC, wantKey: "media.s3.secret_key"},
	"media.s3.secret_key": {bad: "secret-without-key", readBy: rP | rC},
	"media.s3.prefix":     {bad: "/abs", readBy: rP | rC},
	"media.s3.tls":        {anyOK: "a flag"},
}

// TestEveryKeyRejectsOutOfRange: for every key of the schema (every key a
// YAML file may set), a value out of range makes the loader of each daemon
// that reads it fail, naming that exact key, before anything connects.
func TestEveryKeyRejectsOutOfRange(t *testing.T) {
	known, maps := map[string]bool{}, []string{}
	schemaKeys("", reflect.TypeOf(union{}), known, &maps)
	for _, m := range maps {
		known[m] = true
	}
	var keys []string
	for k := range known {
		keys = append(keys, k)
		if _, ok := outOfRange[k]; !ok {
			t.Errorf("key %s has no out-of-range value in outOfRange: add its bound", k)
		}
	}
	for k := range outOfRange {
		if !known[k] {
			t.Errorf("outOfRange names %s, which the schema does not have", k)
		}
	}
	sort.Strings(keys)
	base, err := os.ReadFile(repoConfig("test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	loaders := []struct {
		bit  int
		name string
		load func(string) error
	}{
		{rP, "kf-producer", func(p string) error { _, err := LoadProducer(p); return err }},
		{rC, "schedule-consumer", func(p string) error { _, err := LoadConsumer(p); return err }},
		{rD, "dlq-consumer", func(p string) error { _, err := LoadDLQConsumer(p); return err }},
	}
	checked := 0
	for _, k := range keys {
		e, ok := outOfRange[k]
		if !ok || e.anyOK != "" {
			continue
		}
		var doc map[string]any
		if err := yaml.Unmarshal(base, &doc); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(k, "media.s3.") { // checked with media.store: s3
			setKey(doc, "media.store", "s3")
			setKey(doc, "media.s3.endpoint", "127.0.0.1:18333")
			setKey(doc, "media.s3.bucket", "kfpipe-media")
		}
		setKey(doc, k, e.bad)
		if k == "redis.master_name" || k == "redis.sentinel_addrs" {
			setKey(doc, "redis.mode", "sentinel")
			if k == "redis.master_name" {
				setKey(doc, "redis.sentinel_addrs", []string{"127.0.0.1:26379"})
			}
		}
		if k == "redis.cluster_addrs" {
			setKey(doc, "redis.mode", "cluster")
		}
		if k == "handler.http.url" {
			setKey(doc, "handler.type", "http")
		}
		if k == "rate_limit.progressive.base" || k == "rate_limit.progressive.max" || k == "rate_limit.progressive.history" {
			setKey(doc, "rate_limit.progressive.enabled", true)
		}
		if strings.HasPrefix(k, "coord.") {
			setKey(doc, "coord.enabled", true)
		}
		out, _ := yaml.Marshal(doc)
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		want := k
		if e.wantKey != "" {
			want = e.wantKey
		}
		for _, l := range loaders {
			if e.readBy&l.bit == 0 {
				continue
			}
			checked++
			err := l.load(path)
			if err == nil {
				t.Errorf("%s: %s: %v accepted", l.name, k, e.bad)
				continue
			}
			if !strings.Contains(err.Error(), want+" ") {
				t.Errorf("%s: %s: %v refused without naming %s: %v", l.name, k, e.bad, want, err)
			}
		}
	}
	t.Logf("%d keys, %d (key, daemon) refusals checked", len(keys), checked)
}

// setKey sets the dotted key in a decoded YAML document.
func setKey(doc map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := doc[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			doc[p] = next
		}
		doc = next
	}
	doc[parts[len(parts)-1]] = v
}
