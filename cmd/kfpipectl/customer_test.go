package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// produceMain writes a text message of user to the main topic as
// kf-producer does (keyed by user) and returns where it landed.
func produceMain(t *testing.T, k config.Kafka, user, upstream string) (*kafka.Message, []byte) {
	t.Helper()
	p, err := kafka.NewProducer(kafkaclient.Producer(k))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: 77, UpstreamMsgID: upstream, OpenKfID: "wk-1", ExternalUserID: user,
		MsgType: "text", SendTime: time.Now().Unix(), ProducedAt: time.Now().UnixMilli(), Content: []byte(`{"text":{"content":"where is my order"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	topic := k.Topics.Main.Name
	ch := make(chan kafka.Event, 1)
	if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key: []byte(user), Value: b}, ch); err != nil {
		t.Fatal(err)
	}
	m := (<-ch).(*kafka.Message)
	if m.TopicPartition.Error != nil {
		t.Fatal(m.TopicPartition.Error)
	}
	return m, b
}

// TestCustomerCommand: kfpipectl customer tells a dead-lettered message's
// story, a blocked user's block and the operator who set it, and says
// "nothing known" of a made-up user.
func TestCustomerCommand(t *testing.T) {
	d, cfg, p := startDLQConsumer(t)
	op := ctl{t: t, env: map[string]string{"KFPIPE_ADMIN_URL": d.AdminURL, "KFPIPE_TOKEN": cfg.Admin.Tokens[0].Token}}
	viewer := op.with("KFPIPE_TOKEN", cfg.Admin.Tokens[1].Token)

	m, b := produceMain(t, cfg.Kafka, "c-dl", "up-c-dl")
	dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: *m.TopicPartition.Topic, Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
		Timestamp: m.Timestamp, Key: m.Key, Value: b}, dlq.ReasonDownstreamError, "crm timed out", time.Now())
	sent := make(chan error, 1)
	p.Send(dl, func(err error) { sent <- err })
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	var tl console.Timeline
	deadline := time.Now().Add(60 * time.Second)
	for {
		jsonOf(t, viewer.must(0, "customer", "c-dl", "-o", "json"), &tl)
		if len(tl.Messages) == 1 && len(tl.Messages[0].Letters) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("letter not in the timeline: %+v", tl)
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := fmt.Sprintf("on partition %d offset %d", m.TopicPartition.Partition, m.TopicPartition.Offset)
	r := viewer.must(0, "customer", "c-dl")
	contains(t, r, "customer c-dl", "DEAD LETTER  up-c-dl", `"where is my order"`, "dead letter "+dl.ID+" downstream_error, state due",
		"state due", "story: received", want, "waiting in the DLQ")

	op.must(0, "ratelimit", "block", "c-blk", "--for", "2h", "--why", "abusive")
	r = viewer.must(0, "customer", "c-blk")
	contains(t, r, "limiter: group", "BLOCKED until", "events:", "ratelimit.block user:c-blk for=2h0m0s  by", "(abusive) ok")

	r = viewer.must(3, "customer", "c-nobody-at-all")
	contains(t, r, "nothing known about user c-nobody-at-all")
	if strings.Contains(r.out, "events:") || strings.Contains(r.out, "story:") {
		t.Errorf("made-up user has a story:\n%s", r.out)
	}
	viewer.must(2, "customer")
	viewer.must(2, "customer", "c-dl", "--window", "nope")
}
