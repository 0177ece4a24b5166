// Package testenv gives integration tests the real services that
// scripts/services.sh starts (Kafka, Redis, etcd), each test with its own
// random topic names and key prefixes so tests never see each other's data.
//
// A missing service fails the test when CI is set and skips it with a
// one-line hint otherwise.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Environment variables that scripts/services.sh exports.
const (
	EnvKafka = "KFPIPE_TEST_KAFKA"
	EnvRedis = "KFPIPE_TEST_REDIS"
	EnvEtcd  = "KFPIPE_TEST_ETCD"
)

const hint = "start the services with `scripts/services.sh up` and export its output, or run `make test`"

// InCI reports whether CI is set: then a missing service is a failure.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "0" && v != "false"
}

// missing fails under CI and skips otherwise.
func missing(t testing.TB, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s unavailable (%v): %s", what, err, hint)
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Short returns a random hex suffix.
func Short() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Name returns a random name for a topic, key prefix or group, mentioning
// the test so leftovers can be traced.
func Name(t testing.TB, kind string) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, t.Name())
	if len(base) > 40 {
		base = base[:40]
	}
	return fmt.Sprintf("t-%s-%s-%s", kind, base, Short())
}

func reachable(addr string) error {
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")
	if i := strings.IndexByte(addr, ','); i >= 0 {
		addr = addr[:i]
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// KafkaBrokers returns the bootstrap servers of the test broker.
func KafkaBrokers(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvKafka)
	if addr == "" {
		missing(t, "Kafka", fmt.Errorf("%s not set", EnvKafka))
	}
	if err := reachable(addr); err != nil {
		missing(t, "Kafka at "+addr, err)
	}
	return addr
}

// Admin returns an AdminClient on the test broker, closed at cleanup.
func Admin(t testing.TB) *kafka.AdminClient {
	t.Helper()
	ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": KafkaBrokers(t)})
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	t.Cleanup(ac.Close)
	return ac
}

// Topic creates a fresh topic with the given partition count (RF 1) on the
// test broker and deletes it at cleanup.
func Topic(t testing.TB, partitions int) string {
	t.Helper()
	name := Name(t, "topic")
	CreateTopic(t, name, partitions)
	return name
}

// CreateTopic creates the named topic and waits until its metadata is
// visible; it is deleted at cleanup.
func CreateTopic(t testing.TB, name string, partitions int) {
	t.Helper()
	ac := Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := ac.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: name, NumPartitions: partitions, ReplicationFactor: 1}})
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError && r.Error.Code() != kafka.ErrTopicAlreadyExists {
			t.Fatalf("create topic %s: %v", name, r.Error)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = ac.DeleteTopics(ctx, []string{name})
	})
	// Visible in the metadata, and every partition's leader answers for
	// it: a test that reads watermarks right away otherwise meets "Not
	// leader for partition" from a broker still taking the lead.
	for {
		err := topicReady(ctx, ac, name, partitions)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s not ready: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// topicReady says why the topic is not yet readable: absent from the
// metadata, a partition without a leader, or a leader that does not yet
// answer for its partition's offsets.
func topicReady(ctx context.Context, ac *kafka.AdminClient, name string, partitions int) error {
	md, err := ac.GetMetadata(&name, false, 5000)
	if err != nil {
		return err
	}
	tm, ok := md.Topics[name]
	if !ok || tm.Error.Code() != kafka.ErrNoError || len(tm.Partitions) != partitions {
		return fmt.Errorf("metadata: %v, %d of %d partitions", tm.Error, len(tm.Partitions), partitions)
	}
	specs := make(map[kafka.TopicPartition]kafka.OffsetSpec, partitions)
	for _, p := range tm.Partitions {
		if p.Leader < 0 || p.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("partition %d: leader %d, %v", p.ID, p.Leader, p.Error)
		}
		specs[kafka.TopicPartition{Topic: &name, Partition: p.ID}] = kafka.LatestOffsetSpec
	}
	res, err := ac.ListOffsets(ctx, specs)
	if err != nil {
		return err
	}
	for tp, info := range res.ResultInfos {
		if info.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("offsets of partition %d: %v", tp.Partition, info.Error)
		}
	}
	return nil
}

// RedisAddr returns the address of the test Redis.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvRedis)
	if addr == "" {
		missing(t, "Redis", fmt.Errorf("%s not set", EnvRedis))
	}
	if err := reachable(addr); err != nil {
		missing(t, "Redis at "+addr, err)
	}
	return addr
}

// Redis returns a client on the test Redis and a fresh key prefix (ending
// in ':'); keys under the prefix are deleted at cleanup.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RedisAddr(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		missing(t, "Redis", err)
	}
	prefix := Name(t, "rd") + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		_ = c.Close()
	})
	return c, prefix
}

// Etcd returns a client on the test etcd and a fresh key prefix (ending in
// '/'); keys under it are deleted at cleanup.
func Etcd(t testing.TB) (*clientv3.Client, string) {
	t.Helper()
	ep := os.Getenv(EnvEtcd)
	if ep == "" {
		missing(t, "etcd", fmt.Errorf("%s not set", EnvEtcd))
	}
	if err := reachable(ep); err != nil {
		missing(t, "etcd at "+ep, err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(ep, ","), DialTimeout: 3 * time.Second})
	if err != nil {
		missing(t, "etcd", err)
	}
	prefix := "/" + Name(t, "etcd") + "/"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.Delete(ctx, prefix, clientv3.WithPrefix())
		_ = c.Close()
	})
	return c, prefix
}

// EtcdEndpoints returns the test etcd endpoints.
func EtcdEndpoints(t testing.TB) []string {
	t.Helper()
	ep := os.Getenv(EnvEtcd)
	if ep == "" {
		missing(t, "etcd", fmt.Errorf("%s not set", EnvEtcd))
	}
	return strings.Split(ep, ",")
}

// RepoRoot returns the repository root (where go.mod is).
func RepoRoot(t testing.TB) string {
	t.Helper()
	if r := os.Getenv("KFPIPE_REPO_ROOT"); r != "" {
		return r
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Script runs a script under scripts/ with args and fails the test on error.
func Script(t testing.TB, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(RepoRoot(t), "scripts", name), args...)
	cmd.Dir = RepoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Tool returns the path of an external command (kcat, redis-server…),
// failing under CI and skipping otherwise when it is missing.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name, err)
	}
	return p
}
