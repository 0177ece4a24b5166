// Package bench is the whole-pipeline benchmark harness behind `make bench`
// and the pieces the load generator (cmd/kf-loadgen) shares with it: a
// message generator, a latency recorder, an effect sink that checks no loss,
// no duplicate effect and per-user order, and the scenarios themselves.
//
// Every scenario runs against the real broker and Redis, creates its own
// topics, consumer groups and Redis key prefix, and measures its baseline
// (a raw librdkafka loop with the same ConfigMap) in the same process, on
// the same machine, right before it. Each scenario is bounded in time.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// Result is one scenario's line of output (one JSON object per line).
// Ratio is msgs_per_sec / baseline_msgs_per_sec for throughput scenarios
// and p99 / baseline p99 for latency scenarios (Extra says which).
type Result struct {
	Scenario           string         `json:"scenario"`
	Msgs               int            `json:"msgs"`
	MsgsPerSec         float64        `json:"msgs_per_sec"`
	P50Ms              float64        `json:"p50_ms"`
	P99Ms              float64        `json:"p99_ms"`
	Baseline           string         `json:"baseline"`
	BaselineMsgsPerSec float64        `json:"baseline_msgs_per_sec"`
	Ratio              float64        `json:"ratio"`
	RSSMiB             float64        `json:"rss_mib"`
	Goal               string         `json:"goal,omitempty"`
	Pass               bool           `json:"pass"`
	Extra              map[string]any `json:"extra,omitempty"`
}

// Env is what every scenario runs on.
type Env struct {
	Brokers   string
	RedisAddr string
	Log       *zap.Logger
	Redis     *redis.Client
	// Cluster, when set (ConnectCluster), is a Redis Cluster some
	// scenarios also run on (redis.mode: cluster) at ClusterAddrs.
	Cluster      *redis.ClusterClient
	ClusterAddrs []string
	Admin        *kafka.AdminClient
	// Prefix is unique per run: topics, groups and Redis keys start with it.
	Prefix string
	// TmpDir holds the DLQ emergency files.
	TmpDir string
	// KafkaOverrides are extra librdkafka properties for every client
	// built from KafkaConfig (diagnostics: debug contexts, statistics).
	KafkaOverrides map[string]string

	mu     sync.Mutex
	topics []string

	counterOnce sync.Once
	counter     *callCounter
}

// NewEnv connects to the broker and Redis.
func NewEnv(brokers, redisAddr string, log *zap.Logger) (*Env, error) {
	if log == nil {
		log = zap.NewNop()
	}
	e := &Env{Brokers: brokers, RedisAddr: redisAddr, Log: log,
		Prefix: fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e12)}
	e.Redis = redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Redis.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis %s: %w", redisAddr, err)
	}
	var err error
	e.Admin, err = kafka.NewAdminClient(kafkaclient.Admin(config.Kafka{Brokers: brokers, ClientID: "kfpipe-bench"}))
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	if e.TmpDir, err = os.MkdirTemp("", "kfpipe-bench-"); err != nil {
		return nil, err
	}
	return e, nil
}

// Close deletes the run's topics and Redis keys and closes the clients.
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.mu.Lock()
	topics := e.topics
	e.mu.Unlock()
	if len(topics) > 0 {
		_, _ = e.Admin.DeleteTopics(ctx, topics)
	}
	unlinkPrefix(ctx, e.Redis, e.Prefix+":*")
	if e.Cluster != nil {
		_ = e.Cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			unlinkPrefix(ctx, m, e.Prefix+":*")
			return nil
		})
		_ = e.Cluster.Close()
	}
	e.Admin.Close()
	_ = e.Redis.Close()
	_ = os.RemoveAll(e.TmpDir)
}

// unlinkPrefix deletes the keys matching match on one server.
func unlinkPrefix(ctx context.Context, c *redis.Client, match string) {
	iter := c.Scan(ctx, 0, match, 10000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			c.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		c.Unlink(ctx, keys...)
	}
}

// Topic creates a fresh topic named after the run and kind.
func (e *Env) Topic(kind string, partitions int) (string, error) {
	name := e.Prefix + "-" + kind
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.Admin.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: name, NumPartitions: partitions,
		ReplicationFactor: 1, Config: map[string]string{"min.insync.replicas": "1", "compression.type": "lz4"}}})
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	if res[0].Error.Code() != kafka.ErrNoError {
		return "", fmt.Errorf("create topic %s: %w", name, res[0].Error)
	}
	e.mu.Lock()
	e.topics = append(e.topics, name)
	e.mu.Unlock()
	// Metadata propagates asynchronously even on one broker.
	time.Sleep(300 * time.Millisecond)
	return name, nil
}

// KafkaConfig is the Kafka section every scenario uses: the project's
// defaults with this broker.
func (e *Env) KafkaConfig(mainTopic, dlqTopic, group string) (config.Kafka, error) {
	c, err := config.LoadConsumer("")
	if err != nil {
		return config.Kafka{}, err
	}
	k := c.Kafka
	k.Brokers = e.Brokers
	k.ClientID = "kfpipe-bench"
	k.Topics.Main.Name, k.Topics.DLQ.Name = mainTopic, dlqTopic
	k.Consumer.GroupID = group
	if len(e.KafkaOverrides) > 0 {
		k.Overrides = maps.Clone(k.Overrides)
		if k.Overrides == nil {
			k.Overrides = map[string]string{}
		}
		maps.Copy(k.Overrides, e.KafkaOverrides)
	}
	return k, nil
}

// ConsumerConfig is the schedule-consumer's default configuration on this
// run's topics, group and Redis prefix, with the rate limiter's default
// group loosened so that nothing is refused (the limiter's code path still
// runs for every message).
func (e *Env) ConsumerConfig(name, mainTopic, dlqTopic string) (*config.Consumer, error) {
	c, err := config.LoadConsumer("")
	if err != nil {
		return nil, err
	}
	c.Env = config.EnvTest
	c.Log.Level = "warn"
	c.Kafka.Brokers = e.Brokers
	c.Kafka.ClientID = "kfpipe-bench"
	c.Kafka.Topics.Main.Name, c.Kafka.Topics.DLQ.Name = mainTopic, dlqTopic
	c.Kafka.Consumer.GroupID = e.Prefix + "-" + name
	c.Redis.Addr = e.RedisAddr
	c.Redis.KeyPrefix = e.Prefix + ":" + name + ":"
	c.Handler.Type = "noop"
	c.DLQ.EmergencyFile = e.TmpDir + "/" + name + "-emergency.jsonl"
	c.RateLimit.Groups["bench"] = config.RateGroup{WindowSeconds: 1, MaxMessages: 1 << 20, PenaltyThreshold: 1 << 20, BlockHours: 1}
	c.RateLimit.DefaultGroup = "bench"
	return c, c.Validate()
}

// Base is a daemon.Base for service.StartConsumer: this run's Redis client,
// a fresh registry (so the metrics code runs as in the daemon) and no ops
// server.
func (e *Env) Base(name string) *daemon.Base {
	return &daemon.Base{Name: name, Log: e.Log, Registry: prometheus.NewRegistry(), Redis: e.Redis}
}

// Messages builds n ChatMessages of about 300 bytes on the wire, spread
// round-robin over users. Upstream msgids are unique per run (tag).
func Messages(tag string, n, users int) []*chatmsg.ChatMessage {
	out := make([]*chatmsg.ChatMessage, n)
	pad := strings.Repeat("x", 14)
	for i := range out {
		out[i] = Message(tag, i, UserName(i%users), pad)
	}
	return out
}

// UserName is the external_userid of user i.
func UserName(i int) string { return fmt.Sprintf("wmUser%07d", i) }

// Message builds the i-th message of a run for user.
func Message(tag string, i int, user, pad string) *chatmsg.ChatMessage {
	msgid := tag + "-" + strconv.Itoa(i)
	// The item as sync_msg returns it, less the fields the ChatMessage
	// already carries, to keep the record near the 300 bytes of a typical
	// short text message.
	raw := `{"msgid":"` + msgid + `","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"` + pad + `"}}`
	return &chatmsg.ChatMessage{MessageID: int64(1e15) + int64(i), UpstreamMsgID: msgid, OpenKfID: "wkBench",
		ExternalUserID: user, MsgType: "text", Origin: 3, SendTime: 1700000000, Content: json.RawMessage(raw)}
}

// WireSize is the mean encoded size of msgs in bytes.
func WireSize(msgs []*chatmsg.ChatMessage) float64 {
	if len(msgs) == 0 {
		return 0
	}
	total := 0
	for _, m := range msgs {
		b, _ := chatmsg.Encode(m)
		total += len(b)
	}
	return float64(total) / float64(len(msgs))
}

// Latencies collects samples (ms) from many goroutines.
type Latencies struct {
	mu sync.Mutex
	v  []float64
}

// Add records one sample in milliseconds.
func (l *Latencies) Add(ms float64) {
	l.mu.Lock()
	l.v = append(l.v, ms)
	l.mu.Unlock()
}

// Len is the number of samples.
func (l *Latencies) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.v)
}

// Quantile returns the q-quantile (nearest rank), 0 without samples.
func (l *Latencies) Quantile(q float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.v) == 0 {
		return 0
	}
	s := slices.Clone(l.v)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// RSSMiB is the process's resident set size now.
func RSSMiB() float64 { return statusField("VmRSS:") }

// PeakRSSMiB is the process's peak resident set size.
func PeakRSSMiB() float64 { return statusField("VmHWM:") }

func statusField(name string) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return round(kb/1024, 1)
		}
	}
	return 0
}

// HeapInuse runs a GC and returns the live heap in bytes.
func HeapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// waitUntil polls cond every 2 ms until it holds or limit passes.
func waitUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// CPUTime is the CPU time (user + system) this process has used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RedisCPU is the CPU time (user + system) the Redis server has used so far
// (INFO cpu); 0 when it cannot be read.
func (e *Env) RedisCPU() time.Duration { return redisCPU(e.Redis) }

// redisCPUOn is RedisCPU of the single Redis, or summed over the Cluster's
// masters.
func (e *Env) redisCPUOn(onCluster bool) time.Duration {
	if !onCluster {
		return e.RedisCPU()
	}
	var mu sync.Mutex
	var total time.Duration
	_ = e.Cluster.ForEachMaster(context.Background(), func(_ context.Context, m *redis.Client) error {
		c := redisCPU(m)
		mu.Lock()
		total += c
		mu.Unlock()
		return nil
	})
	return total
}

func redisCPU(c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// countCalls starts counting, on the client, the commands sent for a
// consumer with Redis key prefix prefix, by part (the store, the limiter,
// the legacy read, other); stop ends it and returns the counts. One count
// at a time.
func (e *Env) countCalls(prefix string) (stop func() map[string]map[string]int64) {
	e.counterOnce.Do(func() {
		e.counter = newCallCounter("")
		e.Redis.AddHook(e.counter)
		if e.Cluster != nil {
			e.Cluster.AddHook(e.counter)
		}
	})
	c := e.counter
	c.mu.Lock()
	c.prefix, c.calls = prefix, map[string]map[string]int64{}
	c.mu.Unlock()
	c.on.Store(true)
	return func() map[string]map[string]int64 {
		c.on.Store(false)
		return c.snapshot()
	}
}
