package testenv

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

func TestClock(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewClock(t0)
	c.Advance(time.Second)
	c.Sleep(2 * time.Second)
	c.Sleep(3 * time.Second)
	if got, want := c.Now(), t0.Add(6*time.Second); !got.Equal(want) {
		t.Fatalf("Now = %s, want %s", got, want)
	}
	if got := c.Slept(); got != 5*time.Second {
		t.Fatalf("Slept = %s, want 5s", got)
	}
	if got := c.Slept(); got != 0 {
		t.Fatalf("Slept after reset = %s, want 0", got)
	}
	c.Set(t0) // backwards
	if !c.Now().Equal(t0) {
		t.Fatalf("Now after Set = %s", c.Now())
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); c.Advance(time.Millisecond) }()
	}
	wg.Wait()
	if got := c.Now().Sub(t0); got != 8*time.Millisecond {
		t.Fatalf("concurrent Advance: moved %s, want 8ms", got)
	}
}

func TestClockAfter(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewClock(t0)
	select {
	case <-c.After(0):
	default:
		t.Fatal("After(0) did not fire at once")
	}
	a, b := c.After(time.Second), c.After(3*time.Second)
	if n := c.Waiters(); n != 2 {
		t.Fatalf("Waiters = %d, want 2", n)
	}
	c.Advance(999 * time.Millisecond)
	select {
	case <-a:
		t.Fatal("After(1s) fired at 999ms")
	default:
	}
	c.Advance(time.Millisecond)
	if got := <-a; !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("After(1s) sent %s", got)
	}
	c.Sleep(5 * time.Second)
	<-b
	if n := c.Waiters(); n != 0 {
		t.Fatalf("Waiters = %d after all fired", n)
	}
}

func TestReadTopicHelpers(t *testing.T) {
	brokers := KafkaBrokers(t)
	topic := Topic(t, 2)
	p, err := newTestProducer(brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, k := range []string{"a", "b", "c"} {
		produceSync(t, p, topic, k, i)
	}
	got := ReadTopic(t, brokers, topic)
	if len(got) != 3 {
		t.Fatalf("ReadTopic: %d records, want 3", len(got))
	}
	got = ReadTopicAtLeast(t, brokers, topic, 2, 200*time.Millisecond)
	if len(got) != 3 {
		t.Fatalf("ReadTopicAtLeast(2) with linger: %d records, want all 3", len(got))
	}
	for _, m := range got {
		if Header(m, "n") == "" || Header(m, "missing") != "" {
			t.Fatalf("Header: n=%q missing=%q", Header(m, "n"), Header(m, "missing"))
		}
	}
}

func newTestProducer(brokers string) (*kafka.Producer, error) {
	return kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "go.logs.channel.enable": false})
}

func produceSync(t *testing.T, p *kafka.Producer, topic, key string, n int) {
	t.Helper()
	ch := make(chan kafka.Event, 1)
	err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key: []byte(key), Value: []byte(key), Headers: []kafka.Header{{Key: "n", Value: []byte(strconv.Itoa(n))}}}, ch)
	if err != nil {
		t.Fatal(err)
	}
	if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
		t.Fatal(m.TopicPartition.Error)
	}
}
