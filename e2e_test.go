package kfpipe_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// e2e is one end-to-end test's place on the test broker and Redis and its
// fake WeChat with the one account kfID: a fresh main topic (the test
// env's partition count), DLQ topic name and key prefix, so tests never
// see each other's data.
type e2e struct {
	brokers, redisAddr  string
	rdb                 *redis.Client
	prefix              string
	mainTopic, dlqTopic string
	kfID                string
	fake                *wecomtest.Server
	produced            int // how many of the fake's messages produce wrote
}

// newE2E sets up a test's place; the fake WeChat is closed at cleanup.
func newE2E(t *testing.T, kfID string) *e2e {
	t.Helper()
	e := &e2e{brokers: testenv.KafkaBrokers(t), redisAddr: testenv.RedisAddr(t), kfID: kfID}
	e.rdb, e.prefix = testenv.Redis(t)
	e.fake = wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	t.Cleanup(e.fake.Close)
	e.mainTopic, e.dlqTopic = testenv.Topic(t, 4), testenv.Name(t, "dlq")
	return e
}

// produce writes the fake's messages of kfID that it has not written yet
// to the main topic as kf-producer would: keyed by user, chatmsg-encoded
// with its headers.
func (e *e2e) produce(t *testing.T) {
	t.Helper()
	var recs []testenv.Record
	msgs := e.fake.Messages(e.kfID)
	for i, m := range msgs[e.produced:] {
		c := *m // the fake's record, numbered and stamped as kf-producer does
		c.MessageID, c.ProducedAt = int64(e.produced+i+1), time.Now().UnixMilli()
		v, err := chatmsg.Encode(&c)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, testenv.Record{Key: []byte(c.ExternalUserID), Value: v, Headers: c.Headers()})
	}
	e.produced = len(msgs)
	testenv.Produce(t, e.brokers, e.mainTopic, recs)
}

// config is config/test.yaml loaded with LoadConfig and pointed at the
// test's place, in a fresh consumer group.
func (e *e2e) config(t *testing.T) *kfpipe.Config {
	t.Helper()
	cfg, err := kfpipe.LoadConfig(filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.Brokers = e.brokers
	cfg.Kafka.Topics.Main.Name, cfg.Kafka.Topics.DLQ.Name = e.mainTopic, e.dlqTopic
	cfg.Kafka.Consumer.GroupID = testenv.Name(t, "group")
	cfg.Redis.Addr, cfg.Redis.KeyPrefix = e.redisAddr, e.prefix
	cfg.WeCom.BaseURL, cfg.WeCom.CorpID, cfg.WeCom.Secret = e.fake.URL(), e.fake.CorpID(), e.fake.Secret()
	cfg.DLQ.EmergencyFile = filepath.Join(t.TempDir(), "emergency.jsonl")
	cfg.Ops.Addr = "127.0.0.1:0"
	cfg.RateLimit.DefaultGroup = "whitelist"
	return cfg
}

// buildExample builds the bot examples/name (the examples are a module of
// their own: only kfpipe's public packages are importable from there) and
// returns the binary's path.
func buildExample(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	build := exec.Command("go", "build", "-o", bin, "./"+name)
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the examples module: %v\n%s", err, out)
	}
	return bin
}

// startBot runs the example bot bin with config/test.yaml pointed at the
// test's place by environment variables, in consumer group group, with
// env added. It is stopped (SIGTERM) at cleanup, and its log shown when
// the test failed.
func (e *e2e) startBot(t *testing.T, bin, group string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "--config", filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	cmd.Env = append(os.Environ(),
		"KFPIPE_KAFKA_BROKERS="+e.brokers, "KFPIPE_KAFKA_TOPICS_MAIN_NAME="+e.mainTopic,
		"KFPIPE_KAFKA_TOPICS_DLQ_NAME="+e.dlqTopic, "KFPIPE_KAFKA_CONSUMER_GROUP_ID="+group,
		"KFPIPE_REDIS_ADDR="+e.redisAddr, "KFPIPE_REDIS_KEY_PREFIX="+e.prefix,
		"KFPIPE_WECOM_BASE_URL="+e.fake.URL(), "KFPIPE_WECOM_CORP_ID="+e.fake.CorpID(), "KFPIPE_WECOM_SECRET="+e.fake.Secret(),
		"KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(t.TempDir(), "emergency.jsonl"), "KFPIPE_OPS_ADDR=127.0.0.1:0",
		"KFPIPE_RATE_LIMIT_DEFAULT_GROUP=whitelist")
	cmd.Env = append(cmd.Env, env...)
	logf, err := os.Create(filepath.Join(t.TempDir(), group+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", group, b)
		}
	})
	return cmd
}
