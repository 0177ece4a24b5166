package sources

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
)

// On librdkafka's mock cluster (the demo's and the simulator's embedded
// Kafka), OffsetsForTimes answers "no record since" for a partition that
// has records of the window: the timeline's read must still find them
// (it checks the newest record's own time) — else a customer whose
// messages were all answered reads "nothing known", like a made-up id.
func TestUserRecordsOnMockCluster(t *testing.T) {
	mc, err := kafka.NewMockCluster(1)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	const topic = "mock-main"
	if err := mc.CreateTopic(topic, 2, 1); err != nil {
		t.Fatal(err)
	}
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": mc.BootstrapServers(), "partitioner": "murmur2_random",
		"go.delivery.reports": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tp := topic
	for i := range 6 {
		user := fmt.Sprintf("mock-user-%d", i%2)
		v, _ := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: int64(i + 1), UpstreamMsgID: fmt.Sprintf("m%d", i), OpenKfID: "wk",
			ExternalUserID: user, MsgType: "text", SendTime: time.Now().Unix(), Content: json.RawMessage(`{"text":{"content":"hi"}}`)})
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: kafka.PartitionAny},
			Key: []byte(user), Value: v}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Flush(10000); n != 0 {
		t.Fatalf("%d records not delivered", n)
	}
	ac, err := kafka.NewAdminClientFromProducer(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	k := config.Kafka{Brokers: mc.BootstrapServers(), ClientID: "mock-timeline", Overrides: map[string]string{}}
	k.Consumer.AutoOffsetReset = "earliest"
	k.Consumer.SessionTimeout = 10 * time.Second
	k.Consumer.MaxPollInterval = time.Minute
	k.Consumer.FetchMaxBytes = 1 << 20
	view := Pipeline{kafka: ac, topic: topic, kcfg: k}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	scan, err := view.UserRecords(ctx, "mock-user-0", time.Now().Add(-72*time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.Records) != 3 {
		t.Fatalf("read %d of mock-user-0's 3 records (from offset %d to %d, low %d)", len(scan.Records), scan.From, scan.To, scan.Low)
	}
}
