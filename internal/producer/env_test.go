package producer

import (
	"strconv"
	"testing"
	"time"

	"github.com/bwmarrin/snowflake"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// This file holds the real-service helpers of the integration tests: a
// Redis lock with the semantics of internal/lock (the test's own, so this
// package's tests do not depend on it), the adapter from the wecom client to
// Source, and a plain consumer that reads a topic back.

func kafkaCfg(brokers string) config.Kafka {
	return config.Kafka{
		Brokers:  brokers,
		ClientID: "kfpipe-producer-test",
		Producer: config.KafkaProducer{LingerMs: 5, BatchSize: 1 << 20, QueueMaxMsgs: 100000,
			Compression: "lz4", DeliveryTimeout: 30 * time.Second},
		Overrides: map[string]string{},
	}
}

type snowIDs struct{ n *snowflake.Node }

func newSnowIDs(t testing.TB, node int64) snowIDs {
	n, err := snowflake.NewNode(node)
	if err != nil {
		t.Fatal(err)
	}
	return snowIDs{n}
}

func (s snowIDs) Next() (int64, error) { return s.n.Generate().Int64(), nil }

// readTopic reads every record of topic (up to the high watermarks taken
// when called).
var readTopic = testenv.ReadTopic

// header returns the value of a record's header.
var header = testenv.Header

// checkRecords verifies the records against the WeChat logs: every message
// of logs present (exactly once when exact), each user in one partition, and
// each user's first occurrences in log order. logs maps open_kfid to its
// message log in WeChat order.
func checkRecords(t *testing.T, recs []*kafka.Message, logs map[string][]*chatmsg.ChatMessage, exact bool) {
	t.Helper()
	type pos struct {
		kf  string
		idx int
	}
	where := map[string]pos{}
	total := 0
	for kf, log := range logs {
		for i, m := range log {
			where[m.UpstreamMsgID] = pos{kf, i}
		}
		total += len(log)
	}
	seen := map[string]int{}
	userPart := map[string]int32{}
	lastIdx := map[string]int{}
	dups := 0
	for _, r := range recs {
		cm, err := chatmsg.Decode(r.Value)
		if err != nil {
			t.Fatalf("record %v: %v", r.TopicPartition, err)
		}
		p, ok := where[cm.UpstreamMsgID]
		if !ok {
			t.Fatalf("record for unknown msgid %q", cm.UpstreamMsgID)
		}
		if string(r.Key) != cm.ExternalUserID || cm.OpenKfID != p.kf {
			t.Fatalf("record %s: key %q open_kfid %q, want %q %q", cm.UpstreamMsgID, r.Key, cm.OpenKfID, cm.ExternalUserID, p.kf)
		}
		if header(r, chatmsg.HeaderUpstreamMsgID) != cm.UpstreamMsgID || header(r, chatmsg.HeaderOpenKfID) != cm.OpenKfID ||
			header(r, chatmsg.HeaderMsgID) != strconv.FormatInt(cm.MessageID, 10) || header(r, chatmsg.HeaderMsgType) != cm.MsgType ||
			header(r, chatmsg.HeaderTimestamp) == "" || cm.ProducedAt == 0 {
			t.Fatalf("record %s: headers %v do not match the payload", cm.UpstreamMsgID, r.Headers)
		}
		seen[cm.UpstreamMsgID]++
		if seen[cm.UpstreamMsgID] > 1 {
			dups++
			continue
		}
		u := cm.ExternalUserID
		if part, ok := userPart[u]; ok && part != r.TopicPartition.Partition {
			t.Fatalf("user %s in partitions %d and %d", u, part, r.TopicPartition.Partition)
		}
		userPart[u] = r.TopicPartition.Partition
		if last, ok := lastIdx[u]; ok && p.idx <= last {
			t.Fatalf("user %s: message %d of the log after message %d", u, p.idx, last)
		}
		lastIdx[u] = p.idx
	}
	if len(seen) != total {
		t.Fatalf("%d distinct messages in Kafka, want %d", len(seen), total)
	}
	if exact && dups > 0 {
		t.Fatalf("%d duplicate records, want none", dups)
	}
	t.Logf("%d records, %d distinct, %d duplicates, %d users", len(recs), len(seen), dups, len(userPart))
}
