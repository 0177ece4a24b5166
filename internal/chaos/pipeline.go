package chaos

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// OperatorToken is the admin token config/test.yaml gives test-operator.
const OperatorToken = "test-operator-token-01"

// Options configures a Pipeline. Zero values take the defaults noted.
type Options struct {
	Brokers string // Kafka bootstrap servers (required)
	Redis   string // Redis address (required)
	Kcat    string // kcat binary (required)

	Consumers  int           // schedule-consumer processes in one group; default 1
	OpenKfIDs  int           // customer-service accounts; default 2
	Partitions int           // main-topic partitions; default 4
	SinkSleep  time.Duration // the Sink sleeps rand [0, SinkSleep] per delivery
	DedupLease time.Duration // dedup.lease; default the shipped one (config.DefaultDedupLease)
	// InFlightSlack is how long after a consumer's kill or freeze the Sink
	// may still stamp a request the victim sent before it (default 2 s; a
	// slow bot's slowest answer): such an effect came without its mark.
	InFlightSlack time.Duration
	// StallLimit, when set, fails the run when a user waits longer than
	// this for its next effect after a consumer kill (max_user_stall).
	StallLimit time.Duration
	// KillsNotForStalls: the scenario's consumer kills test something
	// other than a user's stall (scale-storm kills a member while it gives
	// its partitions up, so nobody waits on it by design): the report
	// neither gives max_user_stall nor fails a kill that found no user
	// waiting.
	KillsNotForStalls bool
	PageLimit         int // wecom.page_limit; default 1000
	// Judge, when set, adds a scenario's own checks on the evidence to the
	// report (Problem fails the scenario) before the line is printed.
	Judge func(ev *Evidence, rep *Report)
	// Replies makes the Sink answer each message with a reply that the
	// consumers send to the fake WeChat; the evidence then judges them
	// (Evidence.judgeReplies).
	Replies bool
	// SentinelAddrs and SentinelMaster, when set, put every daemon (and
	// the suite's own Redis client) on Redis Sentinel; Redis is then only
	// the address the shared defaults name.
	SentinelAddrs  []string
	SentinelMaster string
	// ClusterAddrs, when set, puts every daemon (and the suite's own Redis
	// client) on the Redis Cluster with these seed nodes (redis.mode
	// cluster); Redis is then only the address the shared defaults name.
	ClusterAddrs []string
	// FailoverWindow: see Pipeline.RecordFailover; default 1s.
	FailoverWindow time.Duration
	// Env is applied to every daemon after the defaults (KFPIPE_… keys).
	Env map[string]string
	// ProducerEnv, ConsumerEnv and DLQEnv are applied to one kind only.
	ProducerEnv, ConsumerEnv, DLQEnv map[string]string
	// ConsumerRedis, when set, gives each schedule-consumer (by name,
	// "consumer-1"…) its own Redis address, e.g. a fault proxy's.
	ConsumerRedis func(name string) string
	// ConsumerBrokers, when set, is the schedule-consumers' Kafka
	// bootstrap address (e.g. a broker listener behind a fault proxy);
	// the other daemons and the evidence use Brokers.
	ConsumerBrokers string
	// ProducerRedis, when set, is kf-producer's Redis address (e.g. a
	// fault proxy's).
	ProducerRedis string
}

func (o *Options) setDefaults() {
	if o.Consumers == 0 {
		o.Consumers = 1
	}
	if o.OpenKfIDs == 0 {
		o.OpenKfIDs = 2
	}
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	if o.DedupLease == 0 {
		o.DedupLease = config.DefaultDedupLease
	}
	if o.PageLimit == 0 {
		o.PageLimit = 1000
	}
	if o.FailoverWindow == 0 {
		o.FailoverWindow = time.Second
	}
}

// Pipeline is the three daemons wired to one fake WeChat, one Sink, random
// topics, a random Redis key prefix and random consumer groups.
type Pipeline struct {
	T         *testing.T
	Opts      Options
	Fake      *wecomtest.Server
	Sink      *Sink
	Producer  *Daemon
	Consumers []*Daemon
	DLQ       *Daemon

	MainTopic, DLQTopic string
	Prefix              string // Redis key prefix
	OpenKfIDs           []string
	AdminURL            string
	FakeURL             string // base URL of the fake WeChat

	onSync atomic.Pointer[func(messages int)]
	// feeder is Run's, so a fault can send the messages of users of its
	// own (their messages are judged like the load's).
	feeder *Feeder

	sender *wecomtest.CallbackSender
	rdb    redis.UniversalClient

	mu        sync.Mutex
	kills     []Kill
	failovers []Failover
	cuts      []Kill
}

// EnvLogDir, when set, is a directory the daemons' logs are written
// under (one directory a run) and kept, instead of the test's own
// temporary directory.
const EnvLogDir = "KFPIPE_CHAOS_LOG_DIR"

// Start starts the producer, then the consumers and the dlq-consumer, and
// waits until all are ready. Everything is stopped at test cleanup.
func Start(t *testing.T, o Options) *Pipeline {
	t.Helper()
	o.setDefaults()
	bin := binDir(t)
	logDir := t.TempDir()
	suffix := testenv.Short()
	if d := os.Getenv(EnvLogDir); d != "" {
		// The daemons' logs kept past the run, for a failure's cause.
		logDir = filepath.Join(d, strings.NewReplacer("/", "_").Replace(t.Name())+"-"+suffix)
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := &Pipeline{T: t, Opts: o, MainTopic: "chaos-main-" + suffix, DLQTopic: "chaos-dlq-" + suffix,
		Prefix: "chaos-" + suffix + ":"}
	for i := range o.OpenKfIDs {
		p.OpenKfIDs = append(p.OpenKfIDs, fmt.Sprintf("wkchaos%s%02d", suffix, i))
	}
	// The fake is served through a wrapper so a scenario can act right
	// after WeChat answered a sync_msg (OnSyncMsg).
	p.Fake = wecomtest.NewHandler(wecomtest.Options{Accounts: p.OpenKfIDs})
	fakeSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := p.onSync.Load()
		if h == nil || r.URL.Path != "/cgi-bin/kf/sync_msg" {
			p.Fake.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		p.Fake.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		var page struct {
			MsgList []json.RawMessage `json:"msg_list"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &page)
		(*h)(len(page.MsgList))
	}))
	t.Cleanup(fakeSrv.Close)
	p.FakeURL = fakeSrv.URL
	p.Sink = NewSink(o.SinkSleep)
	p.Sink.Reply(o.Replies)
	t.Cleanup(p.Sink.Close)
	switch {
	case len(o.ClusterAddrs) > 0:
		p.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: o.ClusterAddrs, MaxRetries: -1})
	case len(o.SentinelAddrs) > 0:
		p.rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: o.SentinelMaster,
			SentinelAddrs: o.SentinelAddrs, MaxRetries: -1})
	default:
		p.rdb = redis.NewClient(&redis.Options{Addr: o.Redis, MaxRetries: -1})
	}
	t.Cleanup(func() { _ = p.rdb.Close() })

	aesKey := randomAESKey()
	const cbToken = "chaos-callback-token"
	cbPort := testenv.FreePort(t)
	p.sender = &wecomtest.CallbackSender{URL: fmt.Sprintf("http://127.0.0.1:%d/wecom/callback", cbPort),
		Token: cbToken, AESKey: aesKey, CorpID: p.Fake.CorpID()}

	cfgPath := filepath.Join(testenv.RepoRoot(t), "config", "test.yaml")
	common := map[string]string{
		"KFPIPE_LOG_LEVEL":                    "info",
		"KFPIPE_KAFKA_BROKERS":                o.Brokers,
		"KFPIPE_KAFKA_TOPICS_MAIN_NAME":       p.MainTopic,
		"KFPIPE_KAFKA_TOPICS_MAIN_PARTITIONS": strconv.Itoa(o.Partitions),
		"KFPIPE_KAFKA_TOPICS_DLQ_NAME":        p.DLQTopic,
		"KFPIPE_REDIS_ADDR":                   o.Redis,
		"KFPIPE_REDIS_KEY_PREFIX":             p.Prefix,
		// The broker's minimum: a killed member's partitions move after 6 s.
		"KFPIPE_KAFKA_CONSUMER_SESSION_TIMEOUT": "6s",
	}
	if len(o.SentinelAddrs) > 0 {
		common["KFPIPE_REDIS_MODE"] = "sentinel"
		common["KFPIPE_REDIS_MASTER_NAME"] = o.SentinelMaster
		common["KFPIPE_REDIS_SENTINEL_ADDRS"] = strings.Join(o.SentinelAddrs, ",")
	}
	if len(o.ClusterAddrs) > 0 {
		common["KFPIPE_REDIS_MODE"] = "cluster"
		common["KFPIPE_REDIS_CLUSTER_ADDRS"] = strings.Join(o.ClusterAddrs, ",")
	}
	producerEnv := map[string]string{
		"KFPIPE_CALLBACK_ADDR":             fmt.Sprintf("127.0.0.1:%d", cbPort),
		"KFPIPE_CALLBACK_TOKEN":            cbToken,
		"KFPIPE_CALLBACK_ENCODING_AES_KEY": aesKey,
		"KFPIPE_WECOM_BASE_URL":            p.FakeURL,
		"KFPIPE_WECOM_CORP_ID":             p.Fake.CorpID(),
		"KFPIPE_WECOM_SECRET":              p.Fake.Secret(),
		"KFPIPE_WECOM_PAGE_LIMIT":          strconv.Itoa(o.PageLimit),
		// A restarted producer syncs every account at once, and a sync whose
		// callback was missed (producer down) is caught up within a second.
		"KFPIPE_WECOM_OPEN_KFIDS":     strings.Join(p.OpenKfIDs, ","),
		"KFPIPE_SYNC_SAFETY_INTERVAL": "1s",
		// A killed holder's sync lock frees after 2 s.
		"KFPIPE_SYNC_LOCK_TTL":  "2s",
		"KFPIPE_SYNC_RETRY_MAX": "2s",
	}
	consumerEnv := map[string]string{
		"KFPIPE_HANDLER_TYPE":                   "http",
		"KFPIPE_DEDUP_LEASE":                    o.DedupLease.String(),
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP":       "whitelist",
		"KFPIPE_KAFKA_CONSUMER_GROUP_ID":        "chaos-consumer-" + suffix,
		"KFPIPE_KAFKA_CONSUMER_COMMIT_INTERVAL": "500ms",
		// Replies in the Sink's answers go to the fake.
		"KFPIPE_WECOM_BASE_URL": p.FakeURL,
		"KFPIPE_WECOM_CORP_ID":  p.Fake.CorpID(),
		"KFPIPE_WECOM_SECRET":   p.Fake.Secret(),
	}
	dlqEnv := map[string]string{
		"KFPIPE_KAFKA_CONSUMER_GROUP_ID":  "chaos-dlq-" + suffix,
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": "whitelist",
		// The overview shows the schedule-consumers' lag.
		"KFPIPE_ADMIN_CONSUMER_GROUP": "chaos-consumer-" + suffix,
	}
	adminPort := testenv.FreePort(t)
	dlqEnv["KFPIPE_ADMIN_ADDR"] = fmt.Sprintf("127.0.0.1:%d", adminPort)
	p.AdminURL = fmt.Sprintf("http://127.0.0.1:%d", adminPort)

	newDaemon := func(name, binName string, kinds ...map[string]string) *Daemon {
		env := envList(common)
		env = append(env, "KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(logDir, name+"-emergency.jsonl"))
		for _, k := range kinds {
			env = append(env, envList(k)...)
		}
		env = append(env, envList(o.Env)...)
		d := &Daemon{Name: name, bin: filepath.Join(bin, binName), args: []string{"--config", cfgPath},
			env: env, envFor: func(string) []string { return nil }, opsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
			logDir: logDir, onKill: p.recordKill, onThaw: p.recordThaw}
		return d
	}
	p.Producer = newDaemon("producer", "kf-producer", producerEnv, o.ProducerEnv)
	if o.ProducerRedis != "" {
		p.Producer.env = append(p.Producer.env, "KFPIPE_REDIS_ADDR="+o.ProducerRedis)
	}
	for i := range o.Consumers {
		name := fmt.Sprintf("consumer-%d", i+1)
		c := newDaemon(name, "schedule-consumer", consumerEnv, o.ConsumerEnv)
		if o.ConsumerBrokers != "" {
			c.env = append(c.env, "KFPIPE_KAFKA_BROKERS="+o.ConsumerBrokers)
		}
		if o.ConsumerRedis != nil {
			c.env = append(c.env, "KFPIPE_REDIS_ADDR="+o.ConsumerRedis(name))
		}
		c.envFor = func(tag string) []string { return []string{"KFPIPE_HANDLER_HTTP_URL=" + p.Sink.URL(tag)} }
		p.Consumers = append(p.Consumers, c)
	}
	p.DLQ = newDaemon("dlq", "dlq-consumer", dlqEnv, o.DLQEnv)

	t.Cleanup(func() {
		// Whatever still runs is stopped here (a scenario that checked a
		// clean shutdown has stopped them already). Logs are dumped on
		// failure, after the processes are gone.
		for _, d := range p.Daemons() {
			if err := d.Stop(20 * time.Second); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
		if t.Failed() {
			for _, d := range p.Daemons() {
				d.dumpLogs(t, 40)
			}
		}
		p.deleteTopics()
		p.deleteKeys()
	})

	// The producer first: it creates the topics; the others then find them.
	began := time.Now()
	defer func() { t.Logf("pipeline ready in %s", time.Since(began).Round(time.Millisecond)) }()
	if err := p.Producer.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Producer.WaitReady(90 * time.Second); err != nil {
		t.Fatal(err)
	}
	rest := append([]*Daemon{p.DLQ}, p.Consumers...)
	for _, d := range rest {
		if err := d.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range rest {
		if err := d.WaitReady(90 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// /readyz is the ops server's, which listens before the dlq-consumer's
	// admin API does: a scenario that calls the admin API at once must find
	// it listening.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.AdminURL + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin API not listening: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// OnSyncMsg sets a function called after the fake WeChat answered a
// sync_msg request, with the number of messages in the page, on the
// request's goroutine (nil removes it). The answer is written but may not
// have reached kf-producer yet.
func (p *Pipeline) OnSyncMsg(f func(messages int)) {
	if f == nil {
		p.onSync.Store(nil)
		return
	}
	p.onSync.Store(&f)
}

// Daemons returns every daemon of the pipeline.
func (p *Pipeline) Daemons() []*Daemon {
	return append([]*Daemon{p.Producer, p.DLQ}, p.Consumers...)
}

func (p *Pipeline) recordKill(k Kill) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kills = append(p.kills, k)
}

// recordThaw notes when the frozen incarnation tag was resumed.
func (p *Pipeline) recordThaw(tag string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.kills) - 1; i >= 0; i-- {
		if k := &p.kills[i]; k.Tag == tag && k.Freeze && k.Thaw.IsZero() {
			k.Thaw = at
			return
		}
	}
}

// RecordFailover notes a kill of the Redis primary, issued at issued and
// done by done: a second effect whose previous effect happened from
// Options.FailoverWindow before issued until done (a done mark the old
// primary acknowledged but had not replicated, or never answered) is
// counted as dup_after_failover, not dup.
func (p *Pipeline) RecordFailover(issued, done time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failovers = append(p.failovers, Failover{Issued: issued, Done: done})
}

// RecordCut notes that the consumer incarnation tag lost its link to
// Redis at at: its effects from Options.FailoverWindow before at until
// 100 ms after (their done marks in flight when the link went) are
// counted as cut_window_effects; a repeat of one is a dup.
func (p *Pipeline) RecordCut(tag string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, Kill{Tag: tag, At: at})
}

// Cuts returns the cuts recorded so far.
func (p *Pipeline) Cuts() []Kill {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Kill(nil), p.cuts...)
}

// Failovers returns the failovers recorded so far.
func (p *Pipeline) Failovers() []Failover {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Failover(nil), p.failovers...)
}

// Kills returns every kill -9 recorded so far.
func (p *Pipeline) Kills() []Kill {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Kill(nil), p.kills...)
}

// Crashes lists the daemon exits nobody asked for.
func (p *Pipeline) Crashes() []string {
	var out []string
	for _, d := range p.Daemons() {
		out = append(out, d.Crashes()...)
	}
	return out
}

// StopAll stops every daemon with SIGTERM and returns the problems: a hang
// past timeout or a non-zero exit.
func (p *Pipeline) StopAll(timeout time.Duration) []string {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []string
	)
	// Consumers first (they flush dead letters), then the rest.
	stop := func(ds []*Daemon) {
		for _, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := d.Stop(timeout); err != nil {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	stop(p.Consumers)
	stop([]*Daemon{p.Producer, p.DLQ})
	return errs
}

// Cursor returns the producer's stored sync cursor of openKfID ("" when
// none or Redis is unreachable).
func (p *Pipeline) Cursor(ctx context.Context, openKfID string) (string, error) {
	v, err := p.rdb.Get(ctx, p.Prefix+"cursor:"+redisconn.Tag(p.rdb, openKfID)).Result()
	if err == redis.Nil {
		return "", nil
	}
	return v, err
}

func (p *Pipeline) deleteTopics() {
	ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": p.Opts.Brokers})
	if err != nil {
		return
	}
	defer ac.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = ac.DeleteTopics(ctx, []string{p.MainTopic, p.DLQTopic})
}

func (p *Pipeline) deleteKeys() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// One UNLINK a key, pipelined: on a Cluster the keys of one batch lie
	// in many slots (every master is scanned).
	_ = redisconn.ScanKeys(ctx, p.rdb, p.Prefix+"*", 1000, func(keys []string) error {
		_, err := p.rdb.Pipelined(ctx, func(pp redis.Pipeliner) error {
			for _, k := range keys {
				pp.Unlink(ctx, k)
			}
			return nil
		})
		return err
	})
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// randomAESKey is a fresh 43-character EncodingAESKey.
func randomAESKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawStdEncoding.EncodeToString(b)[:43]
}

// KeyMemory returns the number of this pipeline's Redis keys and the
// memory Redis reports for them (MEMORY USAGE, summed): what the run costs
// Redis, apart from anything else sharing the server.
func (p *Pipeline) KeyMemory(ctx context.Context) (keys int, bytes int64, err error) {
	err = redisconn.ScanKeys(ctx, p.rdb, p.Prefix+"*", 1000, func(batch []string) error {
		for _, k := range batch {
			n, err := p.rdb.MemoryUsage(ctx, k).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			keys++
			bytes += n
		}
		return nil
	})
	return keys, bytes, err
}
