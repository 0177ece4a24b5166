package dlq

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// manualClock is the shared test clock; Add is this package's name for
// Advance.
type manualClock struct{ *testenv.Clock }

func newClock() *manualClock {
	return &manualClock{testenv.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
}

func (c *manualClock) Add(d time.Duration) { c.Advance(d) }

// testConfig is the dlq-consumer default configuration pointed at the test
// broker with fresh topics.
func testConfig(t *testing.T, brokers, mainTopic, dlqTopic string) *config.DLQConsumer {
	t.Helper()
	cfg, err := config.LoadDLQConsumer("")
	if err != nil {
		t.Fatalf("default config: %v", err)
	}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Topics.Main.Name = mainTopic
	cfg.Kafka.Topics.DLQ.Name = dlqTopic
	cfg.Kafka.Producer.LingerMs = 1
	cfg.Kafka.Producer.DeliveryTimeout = 5 * time.Second
	cfg.Kafka.Consumer.GroupID = testenv.Name(t, "grp")
	cfg.Kafka.Consumer.SessionTimeout = 6 * time.Second
	cfg.DLQ.EmergencyFile = t.TempDir() + "/emergency/dlq.jsonl"
	cfg.DLQ.ProduceTimeout = 5 * time.Second
	cfg.DLQ.ReplayInterval = 0
	cfg.Recovery.ScanInterval = 20 * time.Millisecond
	cfg.Recovery.LockTTL = time.Second
	return cfg
}

// chat returns a main-topic payload of user.
func chat(user string, n int) []byte {
	b, _ := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: int64(n), UpstreamMsgID: fmt.Sprintf("up-%d", n),
		OpenKfID: "wk-1", ExternalUserID: user, MsgType: "text", SendTime: 1, Content: []byte(`{"text":"hi"}`)})
	return b
}

// deadLetter builds a dead letter of user for source offset off.
func deadLetter(user string, reason Reason, off int64, at time.Time) *chatmsg.DeadLetter {
	return chatmsg.NewDeadLetter(chatmsg.Source{Topic: "src-main", Partition: 1, Offset: off, Timestamp: at, Key: []byte(user), Value: chat(user, int(off)),
		Headers: []chatmsg.Header{{Key: chatmsg.HeaderMsgType, Value: []byte("text")}}}, reason, "test failure", at)
}

// readTopic reads every partition of topic from the beginning until n
// records arrived, then keeps reading for linger to catch extras.
var readTopic = testenv.ReadTopicAtLeast

// header returns the value of a record's header.
var header = testenv.Header

// sendSync sends dl and waits for done.
func sendSync(t *testing.T, p *Producer, dl *chatmsg.DeadLetter) {
	t.Helper()
	ch := make(chan error, 1)
	p.Send(dl, func(err error) { ch <- err })
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("send %s: %v", dl.ID, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("send %s: done not called", dl.ID)
	}
}

func closeProducer(t *testing.T, p *Producer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Errorf("close producer: %v", err)
	}
}

// sinkWaiter is an EventSink that forwards to the producer and lets the
// test wait until every event is durable.
type sinkWaiter struct {
	p  *Producer
	wg sync.WaitGroup
}

func (s *sinkWaiter) Send(dl *chatmsg.DeadLetter, done func(error)) {
	s.wg.Add(1)
	s.p.Send(dl, func(err error) { done(err); s.wg.Done() })
}

// memLetters is the Letters of tests that index letters directly rather
// than through the DLQ topic: each letter is kept encoded, as the topic
// keeps it, at a coordinate of its own (partition 0, offsets counted up
// across the package's tests). Tests of the topic path use TopicLetters.
type memLetters struct {
	mu   sync.Mutex
	m    map[Coord][]byte
	next int64
}

var mem = &memLetters{m: map[Coord][]byte{}}

func (l *memLetters) Read(_ context.Context, at []Coord) ([]*chatmsg.DeadLetter, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*chatmsg.DeadLetter, len(at))
	for i, c := range at {
		if b, ok := l.m[c]; ok {
			dl, err := Decode(b)
			if err != nil {
				return nil, err
			}
			out[i] = dl
		}
	}
	return out, nil
}

// put stores dl and returns its coordinate.
func (l *memLetters) put(t testing.TB, dl *chatmsg.DeadLetter) Coord {
	b, err := Encode(dl)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := Coord{Offset: l.next}
	l.next++
	l.m[c] = b
	return c
}

// forget drops the letter at c, as retention would.
func (l *memLetters) forget(c Coord) {
	l.mu.Lock()
	delete(l.m, c)
	l.mu.Unlock()
}

// indexDL indexes dl as the DLQ consumer would after reading it from the
// topic at a coordinate of mem.
func indexDL(t testing.TB, ctx context.Context, idx *Index, dl *chatmsg.DeadLetter) (IndexResult, error) {
	dl.EnsureID()
	return idx.Index(ctx, dl, mem.put(t, dl))
}

// topicLetters is a TopicLetters of the test's DLQ topic, closed at the
// end of the test.
func topicLetters(t *testing.T, cfg *config.DLQConsumer) *TopicLetters {
	t.Helper()
	l, err := NewTopicLetters(cfg.Kafka)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// runConsumer runs c until the end of the test, which then checks that it
// stopped cleanly.
func runConsumer(t *testing.T, c *Consumer) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}
