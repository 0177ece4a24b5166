package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// testConfig is a consumer configuration for the test broker with short
// intervals.
func testConfig(t testing.TB, topic string) config.Consumer {
	var c config.Consumer
	c.Env = config.EnvTest
	c.Kafka = config.Kafka{
		Brokers: testenv.KafkaBrokers(t), ClientID: "kfpipe-consumer-test",
		Topics: config.Topics{Main: config.Topic{Name: topic}},
		Consumer: config.KafkaConsumer{GroupID: testenv.Name(t, "group"), SessionTimeout: 6 * time.Second,
			MaxPollInterval: time.Minute, AutoOffsetReset: "earliest", FetchMaxBytes: 50 << 20,
			CommitInterval: 100 * time.Millisecond, CommitEveryN: 100, RevokeDrainLimit: 5 * time.Second},
		Overrides: map[string]string{},
	}
	c.Processor = config.Processor{MailboxSize: 256, IdleTimeout: time.Second, MaxInFlight: 10000, ResumeBelow: 5000,
		RetryAttempts: 3, RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, AttemptTimeout: 2 * time.Second,
		MaxMessageBytes: 1 << 20, DeadLetterQueue: 1024}
	c.Dedup = config.Dedup{TTL: time.Hour, Lease: 30 * time.Second}
	// The handler limit well above what a test runs at once (the adaptive
	// limit's own tests set theirs), retries not budgeted: a test of
	// ownership or order is not throttled by the overload control.
	c.Overload = config.Overload{MaxInFlight: 1024, InitialLimit: 256, Tolerance: 1.3}
	return c
}

// produce writes msgs keyed by user and waits for every delivery.
func produce(t testing.TB, topic string, msgs []*chatmsg.ChatMessage) {
	t.Helper()
	recs := make([][2][]byte, len(msgs))
	for i, m := range msgs {
		b, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = [2][]byte{[]byte(m.ExternalUserID), b}
	}
	produceRaw(t, topic, recs)
}

// produceRaw writes key/value records in order and waits for delivery.
func produceRaw(t testing.TB, topic string, recs [][2][]byte) {
	t.Helper()
	rs := make([]testenv.Record, len(recs))
	for i, r := range recs {
		rs[i] = testenv.Record{Key: r[0], Value: r[1]}
	}
	testenv.Produce(t, testenv.KafkaBrokers(t), topic, rs)
}

func chat(user string, i int) *chatmsg.ChatMessage {
	return &chatmsg.ChatMessage{MessageID: int64(i + 1), UpstreamMsgID: fmt.Sprintf("msg-%s-%06d", user, i),
		OpenKfID: "wkTEST", ExternalUserID: user, MsgType: "text", SendTime: time.Now().Unix(),
		ProducedAt: time.Now().UnixMilli(), Content: []byte(fmt.Sprintf(`{"seq":%d}`, i))}
}

// committed returns the group's committed offset for each partition of
// topic (-1 when none).
func committed(t testing.TB, group, topic string, partitions int) []int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t), "group.id": group})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tps []kafka.TopicPartition
	for p := 0; p < partitions; p++ {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: int32(p)})
	}
	res, err := c.Committed(tps, 10000)
	if err != nil {
		t.Fatalf("committed: %v", err)
	}
	out := make([]int64, partitions)
	for _, tp := range res {
		out[tp.Partition] = int64(tp.Offset)
		if tp.Offset < 0 {
			out[tp.Partition] = -1
		}
	}
	return out
}

// waitCount waits until the counter n reaches want; what names the count
// in the timeout's error.
func waitCount(t testing.TB, d time.Duration, what string, n *atomic.Int64, want int64) {
	t.Helper()
	testenv.Eventually(t, d, func() error {
		got := n.Load()
		return testenv.Check(got == want, "%s: %d, want %d", what, got, want)
	})
}

// waitMetric waits until the counter or gauge m reads want; what names it
// in the timeout's error.
func waitMetric(t testing.TB, d time.Duration, what string, m prometheus.Metric, want float64) {
	t.Helper()
	testenv.Eventually(t, d, func() error {
		got := testenv.MetricValue(m)
		return testenv.Check(got == want, "%s: %v, want %v", what, got, want)
	})
}

// waitCommitted waits until the group's committed offset on partition 0 of
// topic is want.
func waitCommitted(t testing.TB, d time.Duration, group, topic string, want int64) {
	t.Helper()
	testenv.Eventually(t, d, func() error {
		got := committed(t, group, topic, 1)[0]
		return testenv.Check(got == want, "committed offset %d, want %d", got, want)
	})
}

// waitCommittable waits until p's offsets are committable up to next.
func waitCommittable(t testing.TB, d time.Duration, p *partition, next int64) {
	t.Helper()
	testenv.Eventually(t, d, func() error {
		got, ok := p.tracker.Committable()
		return testenv.Check(ok && got == next, "committable %d (%v), want %d", got, ok, next)
	})
}

// memDLQ is an in-memory DeadLetters; while gate is non-nil, confirmations
// wait for it to be closed.
type memDLQ struct {
	mu      sync.Mutex
	letters []*chatmsg.DeadLetter
	gate    chan struct{}
	wg      sync.WaitGroup
}

func (d *memDLQ) Send(dl *chatmsg.DeadLetter, done func(error)) {
	d.mu.Lock()
	d.letters = append(d.letters, dl)
	gate := d.gate
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if gate != nil {
			<-gate
		}
		done(nil)
	}()
}

func (d *memDLQ) byReason() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string]int{}
	for _, l := range d.letters {
		m[string(l.Reason)]++
	}
	return m
}

func (d *memDLQ) all() []*chatmsg.DeadLetter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*chatmsg.DeadLetter(nil), d.letters...)
}

// redisState is a State on real Redis, simpler than package state's: a
// partition's lease is a key taken with SET NX PX (waited on while another
// owner holds it) and never renewed (lease outlasts the test), a done mark
// a key per message.
type redisState struct {
	rdb    *redis.Client
	prefix string
	lease  time.Duration
}

func (s *redisState) Acquire(ctx context.Context, topic string, partition int32) (Lease, error) {
	key := fmt.Sprintf("%sst:{%s:%d}:own", s.prefix, topic, partition)
	owner := fmt.Sprintf("%p", &key)
	for {
		ok, err := s.rdb.SetNX(ctx, key, owner, s.lease).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	tok, err := s.rdb.Incr(ctx, key+":token").Result()
	if err != nil {
		return nil, err
	}
	return &redisLease{MemReplyLog: handler.NewMemReplyLog(), s: s, key: key, owner: owner, token: tok, lost: make(chan struct{})}, nil
}

type redisLease struct {
	*handler.MemReplyLog
	s          *redisState
	key, owner string
	token      int64
	lost       chan struct{}
}

func (l *redisLease) Token() int64          { return l.token }
func (l *redisLease) Lost() <-chan struct{} { return l.lost }

func (l *redisLease) Seen(ctx context.Context, items []StateItem) ([]bool, error) {
	out := make([]bool, len(items))
	for i, it := range items {
		n, err := l.s.rdb.Exists(ctx, l.s.prefix+"dedup:"+it.Key).Result()
		if err != nil {
			return nil, err
		}
		out[i] = n == 1
	}
	return out, nil
}

func (l *redisLease) Mark(it StateItem, _ int64, done func(bool)) {
	err := l.s.rdb.Set(context.Background(), l.s.prefix+"dedup:"+it.Key, "done", time.Hour).Err()
	done(err == nil)
}

func (l *redisLease) Release(ctx context.Context) error {
	if v, err := l.s.rdb.Get(ctx, l.key).Result(); err == nil && v == l.owner {
		return l.s.rdb.Del(ctx, l.key).Err()
	}
	return nil
}

// startConsumer creates and starts a consumer, closing it at cleanup.
func startConsumer(t testing.TB, cfg config.Consumer, h Handler, dlq DeadLetters, opts ...Option) *Consumer {
	t.Helper()
	c, err := New(cfg, h, dlq, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}
