package kfpipe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestNewConsumerRuns builds a consumer in code — the test configuration
// file loaded with LoadConfig, then changed as Go fields — and runs it on
// the real broker and Redis against the fake WeChat: the customer's
// message is answered, the servicer's is not, a retry from the DLQ says
// so in Message; Run returns nil once its context ends.
func TestNewConsumerRuns(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	_, prefix := testenv.Redis(t)
	const kfID = "wk-newconsumer"
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	defer fake.Close()
	mainTopic := testenv.Topic(t, 4)
	fake.AddText(kfID, "u1", "hello")
	raw, _ := json.Marshal(map[string]any{"open_kfid": kfID, "external_userid": "u1", "origin": kfpipe.OriginServicer,
		"servicer_userid": "alice", "msgtype": "text", "text": map[string]any{"content": "Hi, I am Alice"}})
	fake.Append(kfID, raw)
	fake.AddText(kfID, "u1", "bye")
	produceLog(t, brokers, mainTopic, fake, kfID)
	// A message the DLQ's recovery put back for the second time: its
	// record carries the recovery's headers.
	lateID := fake.AddText(kfID, "u2", "late")
	for i, m := range fake.Messages(kfID) {
		if m.UpstreamMsgID != lateID {
			continue
		}
		c := m
		c.MessageID, c.ProducedAt = int64(100+i), time.Now().UnixMilli()
		v, err := chatmsg.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		hs := append(c.Headers(), [2]string{chatmsg.HeaderRetryFromDLQ, "true"}, [2]string{chatmsg.HeaderRetryCount, "2"})
		testenv.Produce(t, brokers, mainTopic, []testenv.Record{{Key: []byte("u2"), Value: v, Headers: hs}})
	}

	cfg, err := kfpipe.LoadConfig(filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Topics.Main.Name, cfg.Kafka.Topics.DLQ.Name = mainTopic, testenv.Name(t, "dlq")
	cfg.Kafka.Consumer.GroupID = testenv.Name(t, "group")
	cfg.Redis.Addr, cfg.Redis.KeyPrefix = redisAddr, prefix
	cfg.WeCom.BaseURL, cfg.WeCom.CorpID, cfg.WeCom.Secret = fake.URL(), fake.CorpID(), fake.Secret()
	cfg.DLQ.EmergencyFile = filepath.Join(t.TempDir(), "emergency.jsonl")
	cfg.Ops.Addr = "127.0.0.1:0"
	cfg.RateLimit.DefaultGroup = "whitelist"

	bad := *cfg
	bad.Processor.RetryAttempts = 0
	if _, err := kfpipe.NewConsumer(&bad, kfpipe.HandlerFunc(nil)); err == nil || !strings.Contains(err.Error(), "processor.retry_attempts") {
		t.Fatalf("a bad configuration: %v, want an error naming processor.retry_attempts", err)
	}
	if _, err := kfpipe.NewConsumer(nil, nil); err == nil {
		t.Fatal("NewConsumer without a configuration succeeded")
	}

	echo := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if text, ok := m.Text(); ok && m.FromCustomer() {
			if m.RetryFromDLQ {
				text += fmt.Sprintf(" (DLQ retry %d)", m.RetryCount)
			}
			return kfpipe.Reply(ctx, kf.Text{Content: "You said: " + text})
		}
		return nil
	})
	c, err := kfpipe.NewConsumer(cfg, echo)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return 30 s after its context ended")
		}
	}()
	waitUntil(t, 60*time.Second, "the replies", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		return len(fake.Replies(kfID, "u1")) >= 2 && len(fake.Replies(kfID, "u2")) >= 1
	})
	time.Sleep(500 * time.Millisecond) // a reply to the servicer would come between the two
	rs := fake.Replies(kfID, "u1")
	if len(rs) != 2 || !strings.Contains(string(rs[0].Body), "You said: hello") || !strings.Contains(string(rs[1].Body), "You said: bye") {
		t.Fatalf("replies %+v, want the two customer messages answered and the servicer's not", rs)
	}
	if rs := fake.Replies(kfID, "u2"); len(rs) != 1 || !strings.Contains(string(rs[0].Body), "You said: late (DLQ retry 2)") {
		t.Fatalf("replies to the DLQ retry %+v, want one that knows it is the second retry from the DLQ", rs)
	}
}
