package kfpipe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/kf"
)

// TestNewConsumerRuns builds a consumer in code — the test configuration
// file loaded with LoadConfig, then changed as Go fields — and runs it on
// the real broker and Redis against the fake WeChat: the customer's
// message is answered, the servicer's is not, a retry from the DLQ says
// so in Message; Run returns nil once its context ends.
func TestNewConsumerRuns(t *testing.T) {
	const kfID = "wk-newconsumer"
	e := newE2E(t, kfID)
	fake := e.fake
	fake.AddText(kfID, "u1", "hello")
	raw, _ := json.Marshal(map[string]any{"open_kfid": kfID, "external_userid": "u1", "origin": kfpipe.OriginServicer,
		"servicer_userid": "alice", "msgtype": "text", "text": map[string]any{"content": "Hi, I am Alice"}})
	fake.Append(kfID, raw)
	fake.AddText(kfID, "u1", "bye")
	e.produce(t)
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
		testenv.Produce(t, e.brokers, e.mainTopic, []testenv.Record{{Key: []byte("u2"), Value: v, Headers: hs}})
	}

	cfg := e.config(t)

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
	testenv.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		u1, u2 := len(fake.Replies(kfID, "u1")), len(fake.Replies(kfID, "u2"))
		return testenv.Check(u1 >= 2 && u2 >= 1, "u1 got %d replies (want 2), u2 %d (want 1)", u1, u2)
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
