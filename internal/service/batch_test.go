package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestBatchRetryOf3000Letters: 3,000 dead letters of 200 users (15 each)
// on a real dlq-consumer, every tenth already processed according to the
// dedup store. The console's dry run counts 2,700 to retry, 300 done, 200
// users; the batch then runs at admin.batch_rate, and the main
// topic (read back whole) holds each of the 9,450 exactly once, none of
// the done ones, and every user's letters in the order of their messages.
func TestBatchRetryOf3000Letters(t *testing.T) {
	// 15 letters a user: the scheduler paces a user's retries at half the
	// default group's rule per window (15 a minute under normal), so each
	// user's letters all go back in the first window and the test reads
	// the batch's rate, not the per-user pacing (TestSchedulerPacesAUsersRetries).
	const users, perUser, rate = 200, 15, 1000
	const total = users * perUser
	pc := newPlace(t)
	rdb, prefix, mainTopic := pc.rdb, pc.prefix, pc.mainTopic
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := pc.dlqConfig(t)
	cfg.Admin.BatchRate = rate
	// Retries an hour away: only the operator's batch re-injects.
	cfg.Recovery.BaseDelay, cfg.Recovery.MaxDelay = time.Hour, 2*time.Hour
	d := startDLQ(t, ctx, cfg)

	// The letters, as a schedule-consumer would write them: user u's
	// messages are source offsets u, u+700, …
	pdlq := cfg.DLQ
	pdlq.EmergencyFile = t.TempDir() + "/feeder-emergency.jsonl"
	p, err := dlq.NewProducer(dlq.ProducerConfig{Kafka: cfg.Kafka, DLQ: pdlq})
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, total)
	sendTime := time.Now().Unix()
	for i := range total {
		user := fmt.Sprintf("bu-%03d", i%users)
		b, err := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: int64(i), UpstreamMsgID: fmt.Sprintf("up-%05d", i), OpenKfID: "wk-batch",
			ExternalUserID: user, MsgType: "text", SendTime: sendTime, Content: []byte(`{"text":{"content":"hi"}}`)})
		if err != nil {
			t.Fatal(err)
		}
		dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: mainTopic, Offset: int64(i), Timestamp: time.Now(), Key: []byte(user), Value: b},
			dlq.ReasonDownstreamError, "test failure", time.Now())
		p.Send(dl, func(err error) { sent <- err })
	}
	for range total {
		if err := <-sent; err != nil {
			t.Fatalf("send dead letter: %v", err)
		}
	}
	sctx, c := context.WithTimeout(ctx, 20*time.Second)
	_ = p.Close(sctx)
	c()
	testenv.Eventually(t, time.Minute, func() error {
		st, err := d.Index.Stats(ctx)
		return testenv.Check(err == nil && st.Total == total, "every letter indexed: total %d of %d (%v)", st.Total, total, err)
	})

	// Every 10th message was processed after all (its dedup mark is done).
	done := map[string]bool{}
	var marks []chatmsg.ChatMessage
	for i := 0; i < total; i += 10 {
		up := fmt.Sprintf("up-%05d", i)
		marks = append(marks, chatmsg.ChatMessage{OpenKfID: "wk-batch", UpstreamMsgID: up, SendTime: sendTime})
		done[up] = true
	}
	markDone(t, rdb, prefix, marks...)

	post := func(body string) console.BatchPlan {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.AdminURL+"/admin/dlq/batch-retry", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer test-operator-token-01")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("batch-retry: %s %s", resp.Status, data)
		}
		var plan console.BatchPlan
		if err := json.Unmarshal(data, &plan); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	dry := post(`{"filter":{"all":true},"reason":"outage over","dry_run":true}`)
	// Users and messages are those of the letters to retry: the users
	// whose every message is done have none.
	toRetry := map[string]bool{}
	for i := range total {
		if !done[fmt.Sprintf("up-%05d", i)] {
			toRetry[fmt.Sprintf("bu-%03d", i%users)] = true
		}
	}
	if dry.Selected != total || dry.AlreadyDone != len(done) || dry.Count != total-len(done) || dry.Messages != dry.Count ||
		dry.Users != len(toRetry) {
		t.Fatalf("dry run: %d selected, %d already done, %d to retry (%d messages), %d users; want %d, %d, %d, %d",
			dry.Selected, dry.AlreadyDone, dry.Count, dry.Messages, dry.Users, total, len(done), total-len(done), len(toRetry))
	}
	plan := post(`{"filter":{"all":true},"reason":"outage over"}`)
	if plan.Batch == nil || plan.Count != dry.Count {
		t.Fatalf("batch answer %+v, want the dry run's count %d", plan, dry.Count)
	}
	var b console.Batch
	testenv.Eventually(t, 2*time.Minute, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.AdminURL+"/admin/dlq/batches/"+plan.Batch.ID, nil)
		req.Header.Set("Authorization", "Bearer test-viewer-token-0001")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return testenv.Check(false, "the batch to end")
		}
		defer resp.Body.Close()
		return testenv.Check(json.NewDecoder(resp.Body).Decode(&b) == nil && b.State != console.BatchRunning, "the batch to end")
	})
	took := b.Finished.Sub(b.Created)
	t.Logf("batch: %d retried, %d skipped (done), %d gone in %s at %d/s", b.Acted, b.SkippedDone, b.Gone, took, rate)
	// The batch holds the letters its dry run counted, the done ones not.
	if b.State != console.BatchDone || b.Acted != dry.Count || b.Total != dry.Count || b.SkippedDone != 0 || b.Gone != 0 {
		t.Fatalf("batch ended %+v; the dry run said %d to retry, %d done", b, dry.Count, dry.AlreadyDone)
	}
	// Paced: it may not run faster than the rate (a second's burst aside).
	if minimum := time.Duration(float64(dry.Count-rate) / rate * float64(time.Second)); took < minimum {
		t.Errorf("batch of %d took %s at %d/s: faster than the rate allows (%s)", dry.Count, took, rate, minimum)
	}

	// The main topic: each retried letter once, in each user's order.
	seen := map[string]int{}
	last := map[string]int64{}
	reordered := 0
	readTopic(t, mainTopic, time.Minute, func() error {
		return testenv.Check(len(seen) >= dry.Count, "%d letters re-injected, want %d", len(seen), dry.Count)
	}, func(m *chatmsg.ChatMessage) {
		seen[m.UpstreamMsgID]++
		if prev, ok := last[m.ExternalUserID]; ok && m.MessageID < prev {
			reordered++
		}
		last[m.ExternalUserID] = m.MessageID
	})
	dups, missing, doneRetried := 0, 0, 0
	for i := range total {
		up := fmt.Sprintf("up-%05d", i)
		n := seen[up]
		switch {
		case done[up] && n > 0:
			doneRetried++
		case !done[up] && n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	t.Logf("main topic: %d re-injected, %d missing, %d twice, %d already done re-injected, %d out of order", len(seen), missing, dups, doneRetried, reordered)
	if missing+dups+doneRetried+reordered != 0 {
		t.Fatalf("re-injection: missing=%d dup=%d done_reinjected=%d reordered=%d", missing, dups, doneRetried, reordered)
	}
}

// readTopic reads topic from the start, calling fn for every message,
// until enough returns nil and then 2 s pass with nothing new, or timeout
// (then enough's error fails the test).
func readTopic(t *testing.T, topic string, timeout time.Duration, enough func() error, fn func(*chatmsg.ChatMessage)) {
	t.Helper()
	kc, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t),
		"group.id": testenv.Name(t, "reader"), "auto.offset.reset": "earliest", "enable.auto.commit": false,
		"isolation.level": "read_committed"})
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if err := kc.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	quiet := time.Time{}
	for time.Now().Before(deadline) {
		ev := kc.Poll(200)
		m, ok := ev.(*kafka.Message)
		if !ok {
			if enough() == nil {
				if quiet.IsZero() {
					quiet = time.Now()
				} else if time.Since(quiet) > 2*time.Second {
					return
				}
			}
			continue
		}
		quiet = time.Time{}
		cm, err := chatmsg.Decode(m.Value)
		if err != nil {
			t.Fatalf("main topic record at %v: %v", m.TopicPartition, err)
		}
		fn(cm)
	}
	if err := enough(); err != nil {
		t.Fatalf("main topic: not enough read in %s: %v", timeout, err)
	}
}
