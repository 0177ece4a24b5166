package kafkaclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/obs"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// Vectors from Kafka's own UtilsTest.testMurmur2.
func TestMurmur2MatchesJava(t *testing.T) {
	cases := map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	}
	for in, want := range cases {
		if got := murmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestConfigMapsFixSafetySettings(t *testing.T) {
	k := testKafka("127.0.0.1:1")
	k.Overrides = map[string]string{"acks": "1", "enable.auto.commit": "true", "socket.keepalive.enable": "true"}
	p := *Producer(k)
	for key, want := range map[string]any{"acks": "all", "enable.idempotence": true, "partitioner": "murmur2_random",
		"compression.type": "lz4", "linger.ms": 5, "socket.keepalive.enable": "true"} {
		if p[key] != want {
			t.Errorf("producer %s = %v, want %v", key, p[key], want)
		}
	}
	c := *Consumer(k, "g")
	for key, want := range map[string]any{"enable.auto.commit": false, "enable.auto.offset.store": false,
		"isolation.level": "read_committed", "partition.assignment.strategy": "cooperative-sticky", "group.id": "g"} {
		if c[key] != want {
			t.Errorf("consumer %s = %v, want %v", key, c[key], want)
		}
	}
}

func testKafka(brokers string) config.Kafka {
	k := config.Kafka{
		Brokers:  brokers,
		ClientID: "kfpipe-test",
		Producer: config.KafkaProducer{LingerMs: 5, BatchSize: 1 << 20, QueueMaxMsgs: 100000, Compression: "lz4", DeliveryTimeout: 30 * time.Second},
		Consumer: config.KafkaConsumer{SessionTimeout: 10 * time.Second, MaxPollInterval: time.Minute, AutoOffsetReset: "earliest", FetchMaxBytes: 1 << 20},
	}
	return k
}

func TestBootstrapCreatesTopicsWithSettings(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	admin := testenv.Admin(t)
	main := config.Topic{Name: testenv.Name(t, "main"), Partitions: 4, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: 604800000, CompressionType: "lz4", MaxMessageBytes: 1048576}
	dlq := config.Topic{Name: testenv.Name(t, "dlq"), Partitions: 2, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: 86400000, CompressionType: "lz4", MaxMessageBytes: 524288}
	t.Cleanup(func() { _, _ = admin.DeleteTopics(context.Background(), []string{main.Name, dlq.Name}) })
	_ = brokers
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := Bootstrap(ctx, admin, main, dlq); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second run (another daemon starting) is fine.
	if err := Bootstrap(ctx, admin, main, dlq); err != nil {
		t.Fatalf("second bootstrap: %v", err)
	}
	for _, want := range []config.Topic{main, dlq} {
		md, err := admin.GetMetadata(&want.Name, false, 5000)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(md.Topics[want.Name].Partitions); got != want.Partitions {
			t.Errorf("%s partitions = %d, want %d", want.Name, got, want.Partitions)
		}
		res, err := admin.DescribeConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: want.Name}})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for name, e := range res[0].Config {
			got[name] = e.Value
		}
		for k, v := range map[string]string{
			"min.insync.replicas": strconv.Itoa(want.MinInsyncReplicas),
			"retention.ms":        strconv.FormatInt(want.RetentionMs, 10),
			"compression.type":    want.CompressionType,
			"max.message.bytes":   strconv.Itoa(want.MaxMessageBytes),
		} {
			if got[k] != v {
				t.Errorf("%s %s = %q, want %q", want.Name, k, got[k], v)
			}
		}
	}
	// A changed partition count is refused with a clear error.
	wrong := main
	wrong.Partitions = 8
	err := Bootstrap(ctx, admin, wrong)
	if !errors.Is(err, ErrPartitionMismatch) || !strings.Contains(err.Error(), "has 4 partitions, config says 8") {
		t.Fatalf("mismatch error = %v", err)
	}
}

// TestRoundTripMurmur2WithKcat produces through the configured producer,
// consumes through the configured consumer, and has kcat (an independent
// client) read the records back: every key sits in the partition the Java
// client would choose.
func TestRoundTripMurmur2WithKcat(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	kcat := testenv.Tool(t, "kcat")
	const partitions, n = 6, 600
	topic := testenv.Topic(t, partitions)
	k := testKafka(brokers)

	p, err := kafka.NewProducer(Producer(k))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("wm-user-%d", i%150)
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: []byte(key), Value: []byte(fmt.Sprintf("%s|%d", key, i))}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	delivered := 0
	for delivered < n {
		select {
		case e := <-p.Events():
			if m, ok := e.(*kafka.Message); ok {
				if m.TopicPartition.Error != nil {
					t.Fatalf("delivery: %v", m.TopicPartition.Error)
				}
				if want := javaPartition(string(m.Key), partitions); m.TopicPartition.Partition != want {
					t.Fatalf("key %s in partition %d, Java client would use %d", m.Key, m.TopicPartition.Partition, want)
				}
				delivered++
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d/%d delivered", delivered, n)
		}
	}

	// Our consumer config reads everything back, in per-key order.
	c, err := kafka.NewConsumer(Consumer(k, testenv.Name(t, "group")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for got := 0; got < n; {
		if time.Now().After(deadline) {
			t.Fatalf("consumed %d/%d", got, n)
		}
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		parts := strings.Split(string(m.Value), "|")
		i, _ := strconv.Atoi(parts[1])
		if prev, ok := last[parts[0]]; ok && i <= prev {
			t.Fatalf("key %s: %d after %d", parts[0], i, prev)
		}
		last[parts[0]] = i
		got++
	}

	// kcat, independently.
	out, err := exec.Command(kcat, "-b", brokers, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
		"-f", "%k %p\n").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	count := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		part, _ := strconv.Atoi(f[1])
		if want := javaPartition(f[0], partitions); int32(part) != want {
			t.Fatalf("kcat sees key %s in partition %d, murmur2 says %d", f[0], part, want)
		}
		count++
	}
	if count != n {
		t.Fatalf("kcat read %d records, want %d", count, n)
	}
}

// TestReadyzFollowsBroker runs a private broker, stops it and starts it
// again: /readyz turns 503 naming kafka, then 200.
func TestReadyzFollowsBroker(t *testing.T) {
	testenv.KafkaBrokers(t) // the shared broker proves the jars and java are there
	name := "readyz-" + testenv.Short()
	port := testenv.FreePortPair(t)
	testenv.Script(t, "kafka.sh", "start", "--name", name, "--port", strconv.Itoa(port))
	t.Cleanup(func() { testenv.Script(t, "kafka.sh", "stop", "--name", name) })

	k := testKafka(fmt.Sprintf("127.0.0.1:%d", port))
	admin, err := kafka.NewAdminClient(Admin(k))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	srv := obs.NewServer(obs.ServerConfig{Addr: "127.0.0.1:0", ReadyTimeout: 2 * time.Second}, prometheus.NewRegistry(), nil)
	srv.AddCheck("kafka", func(ctx context.Context) error { return Ping(ctx, admin) })
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	url := "http://" + srv.Addr() + "/readyz"

	waitStatus := func(want int, within time.Duration) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			resp, err := http.Get(url)
			if err == nil {
				var b bytes.Buffer
				_, _ = b.ReadFrom(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == want {
					return b.String()
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz did not become %d within %s (last err %v)", want, within, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitStatus(200, 30*time.Second)
	testenv.Script(t, "kafka.sh", "stop", "--name", name)
	body := waitStatus(503, 30*time.Second)
	if !strings.Contains(body, "kafka") {
		t.Fatalf("503 body does not name kafka: %q", body)
	}
	testenv.Script(t, "kafka.sh", "resume", "--name", name)
	waitStatus(200, 60*time.Second)
}

// TestGroupLag: a topic with 5 records in partition 0 and 3 in partition
// 1; the group committed 2 in partition 0 and nothing in 1: the lags are
// 3 and 3, and the committed offset of partition 1 is -1.
func TestGroupLag(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	admin := testenv.Admin(t)
	topic := config.Topic{Name: testenv.Name(t, "lag"), Partitions: 2, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: 3600000, CompressionType: "lz4", MaxMessageBytes: 1048576}
	t.Cleanup(func() { _, _ = admin.DeleteTopics(context.Background(), []string{topic.Name}) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := Bootstrap(ctx, admin, topic); err != nil {
		t.Fatal(err)
	}
	p, err := kafka.NewProducer(Producer(testKafka(brokers)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dr := make(chan kafka.Event, 8)
	for part, n := range map[int32]int{0: 5, 1: 3} {
		for range n {
			if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic.Name, Partition: part},
				Value: []byte("x")}, dr); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 8 {
		select {
		case ev := <-dr:
			if m, ok := ev.(*kafka.Message); !ok || m.TopicPartition.Error != nil {
				t.Fatalf("delivery: %v", ev)
			}
		case <-ctx.Done():
			t.Fatal("records not delivered")
		}
	}
	group := testenv.Name(t, "group")
	if _, err := admin.AlterConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{{Group: group,
		Partitions: []kafka.TopicPartition{{Topic: &topic.Name, Partition: 0, Offset: 2}}}}); err != nil {
		t.Fatal(err)
	}
	reader, err := GroupReader(testKafka(brokers), group)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	got, err := GroupLag(ctx, admin, reader, topic.Name)
	if err != nil {
		t.Fatal(err)
	}
	want := []PartitionLag{{Partition: 0, End: 5, Committed: 2, Lag: 3}, {Partition: 1, End: 3, Committed: -1, Lag: 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lag %+v, want %+v", got, want)
	}
	if _, err := GroupLag(ctx, admin, reader, testenv.Name(t, "missing")); err == nil {
		t.Fatal("no error for a topic that does not exist")
	}
}
