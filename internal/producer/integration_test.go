package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// instance is one kf-producer's sync side on real services.
type instance struct {
	s  *Syncer
	kp *KafkaProducer
}

func newInstance(t *testing.T, node int64, brokers string, kcfg func(*SyncerConfig), rdb redis.UniversalClient,
	prefix, topic string, fake *wecomtest.Server) *instance {
	t.Helper()
	kc := kafkaCfg(brokers)
	kc.Producer.DeliveryTimeout = 3 * time.Second
	kp, err := NewKafkaProducer(kc, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := wecom.NewClient(wecom.ClientConfig{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := SyncerConfig{Topic: topic, KeyPrefix: prefix, PageLimit: 1000, LockTTL: 3 * time.Second,
		RetryBase: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond, Workers: 4, DeliveryWait: 5 * time.Second}
	if kcfg != nil {
		kcfg(&cfg)
	}
	s, err := NewSyncer(cfg, SyncerDeps{Source: WeComSource{wc}, Locker: LockAdapter{lock.New(rdb, "")}, State: NewRedisState(rdb, prefix),
		Publisher: kp, IDs: newSnowIDs(t, node)}, WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Error(err)
		}
		_ = kp.Close(ctx)
	})
	return &instance{s: s, kp: kp}
}

// appendTraffic writes n text messages from users u-0…u-(users-1); user i
// belongs to kfs[i % len(kfs)], so each user's order is one account's log
// order.
func appendTraffic(fake *wecomtest.Server, kfs []string, users, from, n int) {
	for i := from; i < from+n; i++ {
		u := i % users
		fake.AddText(kfs[u%len(kfs)], fmt.Sprintf("u-%d", u), fmt.Sprintf("hello %d %s", i, strings.Repeat("x", 60)))
	}
}

func waitCaughtUp(t *testing.T, st *RedisState, fake *wecomtest.Server, kfs []string, timeout time.Duration, extra func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done := true
		var state []string
		for _, kf := range kfs {
			c, err := st.Cursor(context.Background(), kf)
			if err != nil {
				t.Fatal(err)
			}
			if c != fake.LastCursor(kf) {
				done = false
			}
			state = append(state, fmt.Sprintf("%s=%q/%q", kf, c, fake.LastCursor(kf)))
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			msg := ""
			if extra != nil {
				msg = extra()
			}
			t.Fatalf("cursors not caught up: %v %s", state, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func logs(fake *wecomtest.Server, kfs []string) map[string][]*chatmsg.ChatMessage {
	out := map[string][]*chatmsg.ChatMessage{}
	for _, kf := range kfs {
		out[kf] = fake.Messages(kf)
	}
	return out
}

// 20k messages over 500 users and 3 accounts arrive exactly once, each user
// in one partition in WeChat order, and the cursors end at WeChat's last.
func TestIntegrationSyncExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 4)
	rdb, prefix := testenv.Redis(t)
	kfs := []string{"wk-a", "wk-b", "wk-c"}
	fake := wecomtest.New(wecomtest.Options{Accounts: kfs})
	t.Cleanup(fake.Close)
	appendTraffic(fake, kfs, 500, 0, 20000)

	in := newInstance(t, 1, brokers, nil, rdb, prefix, topic, fake)
	start := time.Now()
	for _, kf := range kfs {
		if err := in.s.Trigger(kf, fake.IssueToken(kf)); err != nil {
			t.Fatal(err)
		}
	}
	st := NewRedisState(rdb, prefix)
	waitCaughtUp(t, st, fake, kfs, 60*time.Second, nil)
	t.Logf("20000 messages synced in %s", time.Since(start))
	if err := in.s.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v", err)
	}
	if err := in.kp.Ready(context.Background()); err != nil {
		t.Fatalf("Ready() = %v", err)
	}
	checkRecords(t, readTopic(t, brokers, topic), logs(fake, kfs), true)
	if n := testenv.MetricValue(in.s.m.messages); n != 20000 {
		t.Fatalf("kfpipe_sync_messages_total = %v, want 20000", n)
	}
	var calls []wecomtest.SyncCall
	for _, c := range fake.SyncCalls() {
		if c.Token != "" {
			calls = append(calls, c)
		}
	}
	if len(calls) != len(kfs) {
		t.Fatalf("%d sync_msg calls carried a callback token, want one per account", len(calls))
	}
}

// Two instances syncing the same accounts while messages keep arriving and
// callbacks hit both: nothing lost, nothing produced twice (the lock is
// never lost here, so every page is produced once per cursor step).
func TestIntegrationTwoInstances(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 4)
	rdb, prefix := testenv.Redis(t)
	kfs := []string{"wk-a", "wk-b", "wk-c"}
	fake := wecomtest.New(wecomtest.Options{Accounts: kfs})
	t.Cleanup(fake.Close)
	small := func(c *SyncerConfig) { c.PageLimit = 50 }
	a := newInstance(t, 1, brokers, small, rdb, prefix, topic, fake)
	b := newInstance(t, 2, brokers, small, rdb, prefix, topic, fake)

	// Callbacks go to one replica at a time (which then syncs; the sync
	// moves between them) or to both at once (they contend for the lock),
	// while later bursts arrive during the contended syncs.
	st := NewRedisState(rdb, prefix)
	trigger := func(in *instance) {
		for _, kf := range kfs {
			if err := in.s.Trigger(kf, fake.IssueToken(kf)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range 30 {
		appendTraffic(fake, kfs, 200, round*200, 200)
		switch round % 3 {
		case 0:
			trigger(a)
			waitCaughtUp(t, st, fake, kfs, 30*time.Second, nil)
		case 1:
			trigger(b)
			waitCaughtUp(t, st, fake, kfs, 30*time.Second, nil)
		case 2:
			trigger(a)
			trigger(b)
		}
	}
	waitCaughtUp(t, st, fake, kfs, 60*time.Second, nil)
	checkRecords(t, readTopic(t, brokers, topic), logs(fake, kfs), true)
	busy := testenv.MetricValue(a.s.m.busy) + testenv.MetricValue(b.s.m.busy)
	both := testenv.MetricValue(a.s.m.messages) > 0 && testenv.MetricValue(b.s.m.messages) > 0
	t.Logf("lock busy %v/%v, pending passes %v/%v, messages %v/%v", testenv.MetricValue(a.s.m.busy), testenv.MetricValue(b.s.m.busy),
		testenv.MetricValue(a.s.m.pending), testenv.MetricValue(b.s.m.pending), testenv.MetricValue(a.s.m.messages), testenv.MetricValue(b.s.m.messages))
	if busy == 0 || !both {
		t.Fatalf("lock busy %v, both produced %v: the test did not exercise a handover under contention", busy, both)
	}
	if p, _ := st.HasPending(context.Background(), "wk-a"); p {
		t.Fatal("pending flag left behind")
	}
}

// Kafka down: the cursor stays, Healthy and Ready report it; Kafka back:
// everything is delivered, each user's order intact.
func TestIntegrationKafkaDownHoldsCursor(t *testing.T) {
	t.Parallel()
	name := "producer-fault"
	brokers, topic := privateBroker(t, name, 4)

	rdb, prefix := testenv.Redis(t)
	kfs := []string{"wk-a", "wk-b"}
	fake := wecomtest.New(wecomtest.Options{Accounts: kfs})
	t.Cleanup(fake.Close)
	in := newInstance(t, 1, brokers, nil, rdb, prefix, topic, fake)
	st := NewRedisState(rdb, prefix)

	appendTraffic(fake, kfs, 50, 0, 500)
	for _, kf := range kfs {
		_ = in.s.Trigger(kf, "")
	}
	waitCaughtUp(t, st, fake, kfs, 30*time.Second, nil)
	before := map[string]string{}
	for _, kf := range kfs {
		before[kf], _ = st.Cursor(context.Background(), kf)
	}

	t0 := time.Now()
	testenv.Script(t, "kafka.sh", "stop", "--name", name)
	t.Logf("broker stopped in %s", time.Since(t0))
	appendTraffic(fake, kfs, 50, 500, 1000)
	for _, kf := range kfs {
		_ = in.s.Trigger(kf, "")
	}
	deadline := time.Now().Add(30 * time.Second)
	for in.s.Healthy() == nil || testenv.MetricValue(in.s.m.runs.WithLabelValues("produce_error")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("Healthy() never reported the produce failures")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s after the stop: Healthy() = %v", time.Since(t0), in.s.Healthy())
	for _, kf := range kfs {
		if c, _ := st.Cursor(context.Background(), kf); c != before[kf] {
			t.Fatalf("%s: cursor moved from %q to %q while Kafka was down", kf, before[kf], c)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := in.kp.Ready(ctx); err == nil {
		t.Error("Ready() = nil while the broker is down")
	}
	cancel()

	t0 = time.Now()
	testenv.Script(t, "kafka.sh", "resume", "--name", name)
	t.Logf("broker resumed in %s", time.Since(t0))
	waitCaughtUp(t, st, fake, kfs, 45*time.Second, func() string { return fmt.Sprint(in.s.Healthy()) })
	t.Logf("caught up %s after the resume", time.Since(t0))
	if err := in.s.Healthy(); err != nil {
		t.Fatalf("Healthy() after recovery = %v", err)
	}
	if err := in.kp.Ready(context.Background()); err != nil {
		t.Fatalf("Ready() after recovery = %v", err)
	}
	checkRecords(t, readTopic(t, brokers, topic), logs(fake, kfs), false)
}

// A page whose broker is gone for several times kafka.producer.delivery_timeout
// is not failed message by message: it stays queued and is delivered whole
// and in order once the broker is back, and the page sent again meanwhile
// waits for it instead of being queued beside it. (With a message timeout,
// librdkafka failed the messages queued first and could deliver the rest
// after the broker's return; the page's re-send then put a user's earlier
// message after a later one.)
func TestIntegrationKafkaDownPageDeliveredWholeInOrder(t *testing.T) {
	t.Parallel()
	name := "producer-whole"
	brokers, topic := privateBroker(t, name, 1)

	kc := kafkaCfg(brokers)
	kc.Topics.Main.Name = topic
	kc.Producer.DeliveryTimeout = time.Second // the least the config allows
	kp, err := NewKafkaProducer(kc, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = kp.Close(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kp.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 300
	page := func(attempt int) []*chatmsg.ChatMessage {
		msgs := make([]*chatmsg.ChatMessage, n)
		for i := range msgs {
			msgs[i] = &chatmsg.ChatMessage{MessageID: int64(attempt*1000 + i), UpstreamMsgID: fmt.Sprintf("m-%03d", i),
				OpenKfID: "wk-a", ExternalUserID: fmt.Sprintf("u-%d", i%10), MsgType: "text", Content: json.RawMessage(`{"content":"hello"}`)}
		}
		return msgs
	}

	testenv.Script(t, "kafka.sh", "stop", "--name", name)
	down := time.Now()
	wait, cancel1 := context.WithTimeout(context.Background(), 3*time.Second)
	err = kp.ProduceBatch(wait, topic, page(1))
	cancel1()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first send with the broker down = %v, want the wait's deadline", err)
	}
	wait, cancel2 := context.WithTimeout(context.Background(), time.Second)
	err = kp.ProduceBatch(wait, topic, page(2))
	cancel2()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "earlier batch") {
		t.Fatalf("second send while the first is queued = %v, want it to wait for the first", err)
	}
	time.Sleep(5*time.Second - time.Since(down))
	testenv.Script(t, "kafka.sh", "resume", "--name", name)
	t.Logf("broker down for %s", time.Since(down).Round(time.Millisecond))
	wait, cancel3 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel3()
	if err := kp.ProduceBatch(wait, topic, page(3)); err != nil {
		t.Fatalf("third send after the broker's return = %v", err)
	}

	var got []int64
	for _, r := range readTopic(t, brokers, topic) {
		m, err := chatmsg.Decode(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.MessageID)
	}
	var want []int64
	for _, attempt := range []int{1, 3} {
		for i := range n {
			want = append(want, int64(attempt*1000+i))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the topic holds %d records %v…, want the first page whole and in order, then the third (%d)", len(got), got[:min(len(got), 20)], len(want))
	}
}

// privateBroker starts a broker of the test's own, named name, that the
// test may stop and resume, with a topic of partitions.
func privateBroker(t *testing.T, name string, partitions int) (brokers, topic string) {
	t.Helper()
	testenv.Tool(t, "java")
	port := testenv.FreePortPair(t)
	testenv.Script(t, "kafka.sh", "start", "--name", name, "--port", fmt.Sprint(port))
	t.Cleanup(func() { testenv.Script(t, "kafka.sh", "stop", "--name", name) })
	brokers = fmt.Sprintf("127.0.0.1:%d", port)
	topic = testenv.Name(t, "topic")
	createTopic(t, brokers, topic, partitions)
	return brokers, topic
}

func createTopic(t *testing.T, brokers, topic string, partitions int) {
	t.Helper()
	ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := ac.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Error.Code() != kafka.ErrNoError {
		t.Fatal(res[0].Error)
	}
	for {
		md, err := ac.GetMetadata(&topic, false, 5000)
		if err == nil && len(md.Topics[topic].Partitions) == partitions && md.Topics[topic].Error.Code() == kafka.ErrNoError {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s not ready: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
