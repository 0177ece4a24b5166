package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// statsDoc builds a librdkafka statistics report with the fields the
// warm-up reads (and a few it does not).
func statsDoc(idemp string, brokers map[string][2]any, topic string, leaders map[int]int) string {
	bs := map[string]any{}
	for name, b := range brokers {
		bs[name] = map[string]any{"name": name, "nodeid": b[0], "state": b[1], "rtt": map[string]any{"p99": 100}}
	}
	parts := map[string]any{"-1": map[string]any{"partition": -1, "leader": -1}}
	for p, l := range leaders {
		parts[fmt.Sprint(p)] = map[string]any{"partition": p, "leader": l, "msgq_cnt": 0}
	}
	doc := map[string]any{"name": "rdkafka#producer-1", "type": "producer", "brokers": bs,
		"topics": map[string]any{topic: map[string]any{"topic": topic, "partitions": parts}},
		"eos":    map[string]any{"idemp_state": idemp, "idemp_stateage": 12, "producer_id": 1000, "producer_epoch": 0}}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestStatsNotReady(t *testing.T) {
	up := map[string][2]any{"127.0.0.1:9092/bootstrap": {-1, "UP"}, "127.0.0.1:9092/1": {1, "UP"}, "127.0.0.1:9094/2": {2, "UP"}}
	cases := []struct {
		name  string
		stats string
		topic string
		parts int
		want  string // "" = ready; else a substring of the reason
	}{
		{"assigned, leaders up", statsDoc("Assigned", up, "t", map[int]int{0: 1, 1: 2}), "t", 2, ""},
		{"no topic asked", statsDoc("Assigned", up, "t", nil), "", 0, ""},
		{"waiting for the PID", statsDoc("WaitPID", up, "t", map[int]int{0: 1, 1: 2}), "t", 2, `state "WaitPID"`},
		{"PID requested", statsDoc("RequestPID", up, "t", map[int]int{0: 1}), "", 0, "not assigned"},
		{"partition count unknown", statsDoc("Assigned", up, "t", map[int]int{0: 1, 1: 2}), "t", 0, "no metadata"},
		{"partitions missing", statsDoc("Assigned", up, "t", map[int]int{0: 1}), "t", 2, "1 of 2 partitions"},
		{"topic unknown to librdkafka", statsDoc("Assigned", up, "other", map[int]int{0: 1}), "t", 1, "0 of 1 partitions"},
		{"no leader", statsDoc("Assigned", up, "t", map[int]int{0: 1, 1: -1, 2: -1}), "t", 3, "no leader known for partitions 1, 2"},
		{"garbage", "{", "t", 1, "unreadable"},
	}
	for _, c := range cases {
		got := StatsNotReady(c.stats, c.topic, c.parts)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: StatsNotReady = %q, want %q", c.name, got, c.want)
		}
	}
}

// A fresh producer is not ready until librdkafka reports its idempotent
// producer ID assigned and the main topic's leaders known; WaitReady
// returns then, Ready agrees, and produce works. (How fast the first page
// is after that is measured by the producer_pipeline benchmark.)
func TestIntegrationKafkaProducerWarmsUp(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 4)
	kc := kafkaCfg(brokers)
	kc.Topics.Main.Name = topic
	kp, err := NewKafkaProducer(kc, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kp.Close(context.Background()) })

	// The first statistics come one StatsInterval after creation: until
	// then nothing says the producer ID is assigned.
	err = kp.Ready(context.Background())
	if !errors.Is(err, ErrWarmingUp) {
		t.Fatalf("Ready() of a fresh producer = %v, want ErrWarmingUp", err)
	}
	t.Logf("fresh: %v", err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := kp.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	t.Logf("ready after %s", time.Since(t0))
	if err := kp.Ready(ctx); err != nil {
		t.Fatalf("Ready() after WaitReady = %v", err)
	}
	if r := StatsNotReady("{}", topic, 4); r == "" {
		t.Fatal("an empty report counts as ready")
	}
	if n := kp.warm.parts.Load(); n != 4 {
		t.Fatalf("warm-up waited for %d partitions, want 4", n)
	}

	msgs := make([]*chatmsg.ChatMessage, 200)
	for i := range msgs {
		msgs[i] = &chatmsg.ChatMessage{MessageID: int64(i + 1), UpstreamMsgID: fmt.Sprintf("warm-%d", i), OpenKfID: "wk",
			ExternalUserID: fmt.Sprintf("u-%d", i%20), MsgType: "text", Content: json.RawMessage(`{}`)}
	}
	if err := kp.ProduceBatch(ctx, topic, msgs); err != nil {
		t.Fatalf("ProduceBatch after ready: %v", err)
	}
	if recs := readTopic(t, brokers, topic); len(recs) != len(msgs) {
		t.Fatalf("%d records in the topic, want %d", len(recs), len(msgs))
	}
}

// A producer whose main topic does not exist never warms up: WaitReady
// says why when its context ends, Ready reports it, and Close ends a
// WaitReady in progress.
func TestIntegrationKafkaProducerNotReadyWithoutTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	kc := kafkaCfg(brokers)
	kc.Topics.Main.Name = testenv.Name(t, "missing")
	kp, err := NewKafkaProducer(kc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = kp.WaitReady(ctx)
	if !errors.Is(err, ErrWarmingUp) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), kc.Topics.Main.Name) {
		t.Fatalf("WaitReady for a missing topic = %v, want ErrWarmingUp naming the topic", err)
	}
	t.Logf("WaitReady: %v", err)
	if err := kp.Ready(context.Background()); !errors.Is(err, ErrWarmingUp) {
		t.Fatalf("Ready() = %v, want ErrWarmingUp", err)
	}
	done := make(chan error, 1)
	go func() { done <- kp.WaitReady(context.Background()) }()
	time.Sleep(100 * time.Millisecond)
	if err := kp.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitReady after Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReady did not return after Close")
	}
}
