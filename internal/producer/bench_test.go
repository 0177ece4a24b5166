package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// benchMessages builds n ChatMessages of about 300 bytes on the wire from
// 500 users, as the sync loop builds them from a page.
func benchMessages(n int) []*chatmsg.ChatMessage {
	out := make([]*chatmsg.ChatMessage, n)
	for i := range out {
		user := fmt.Sprintf("wmUser%06d", i%500)
		msgid := fmt.Sprintf("msg%012d", i)
		raw := fmt.Sprintf(`{"msgid":"%s","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"%s"}}`,
			msgid, strings.Repeat("x", 14))
		out[i] = &chatmsg.ChatMessage{MessageID: int64(1e15) + int64(i), UpstreamMsgID: msgid, OpenKfID: "wkBench",
			ExternalUserID: user, MsgType: "text", Origin: 3, SendTime: 1700000000, Content: json.RawMessage(raw)}
	}
	return out
}

// BenchmarkProducePipeline compares, on the real broker and a fresh topic
// with 4 partitions per run, the full producer path (ProduceBatch of pages
// of 1000: encode, headers, async produce, wait for the page's reports)
// with a raw librdkafka produce loop of the same records (encoded and with
// headers beforehand) and the same ConfigMap. streams=1 is one open_kfid's
// backlog (each page waits for its reports before the next, as I1 needs);
// streams=4 is four open_kfids synced at once. It reports both rates and
// their ratio; run it with a fixed count, e.g. -benchtime=200000x.
func BenchmarkProducePipeline(b *testing.B) {
	for _, streams := range []int{1, 4} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) { benchPipeline(b, streams) })
	}
}

func benchPipeline(b *testing.B, streams int) {
	brokers := testenv.KafkaBrokers(b)
	cfg := kafkaCfg(brokers)
	msgs := benchMessages(b.N)
	size := 0
	for _, m := range msgs {
		v, _ := chatmsg.Encode(m)
		size += len(v)
	}

	rawTopic := testenv.Topic(b, 4)
	raw := make([]*kafka.Message, b.N)
	for i, m := range msgs {
		km, err := kafkaMessage(rawTopic, m)
		if err != nil {
			b.Fatal(err)
		}
		raw[i] = km
	}
	rawRate := rawProduce(b, cfg, raw)

	pipeTopic := testenv.Topic(b, 4)
	kp, err := NewKafkaProducer(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = kp.Close(context.Background()) }()
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := s * 1000; lo < len(msgs); lo += 1000 * streams {
				if err := kp.ProduceBatch(ctx, pipeTopic, msgs[lo:min(lo+1000, len(msgs))]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	pipeRate := float64(b.N) / time.Since(start).Seconds()
	b.StopTimer()

	b.ReportMetric(float64(size)/float64(b.N), "B/msg")
	b.ReportMetric(rawRate, "raw_msgs/s")
	b.ReportMetric(pipeRate, "pipeline_msgs/s")
	b.ReportMetric(pipeRate/rawRate, "ratio")
}

// rawProduce produces every message with plain Produce calls, reading the
// delivery reports on Events, and returns messages per second until the
// last report.
func rawProduce(b *testing.B, cfg config.Kafka, msgs []*kafka.Message) float64 {
	cm, err := producerConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p, err := kafka.NewProducer(cm)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // drain logs
		defer wg.Done()
		for range p.Logs() {
		}
	}()
	delivered := make(chan error, 1)
	go func() {
		defer wg.Done()
		n, failed := 0, 0
		for ev := range p.Events() {
			if m, ok := ev.(*kafka.Message); ok {
				if m.TopicPartition.Error != nil {
					failed++
				}
				if n++; n == len(msgs) {
					if failed > 0 {
						delivered <- fmt.Errorf("%d delivery failures", failed)
					} else {
						delivered <- nil
					}
				}
			}
		}
	}()
	defer func() { p.Close(); wg.Wait() }()
	start := time.Now()
	for _, m := range msgs {
		for {
			err := p.Produce(m, nil)
			if err == nil {
				break
			}
			var ke kafka.Error
			if !errors.As(err, &ke) || ke.Code() != kafka.ErrQueueFull {
				b.Fatal(err)
			}
			time.Sleep(queueFullWait)
		}
	}
	if err := <-delivered; err != nil {
		b.Fatal(err)
	}
	return float64(len(msgs)) / time.Since(start).Seconds()
}
