package outcome

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// Topic is the outcomes topic's specification: the main topic's settings
// (its partitions too: a user's outcomes sit in the partition number of
// their messages) under archive.outcomes_topic.
func Topic(k config.Kafka, a config.Archive) config.Topic {
	t := k.Topics.Main
	t.Name = a.OutcomesTopic
	return t
}

// Writer writes outcome records to the outcomes topic with the pipeline's
// producer settings (acks=all, idempotent, lz4).
type Writer struct {
	p     *kafka.Producer
	topic string
	log   *zap.Logger
	// wait bounds how long a call waits for its record's delivery.
	wait       time.Duration
	written    prometheus.Counter
	unrecorded prometheus.Counter
}

// NewWriter returns a writer to topic; reg (nil: none) gets its counters.
func NewWriter(k config.Kafka, topic string, log *zap.Logger, reg prometheus.Registerer) (*Writer, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cm := kafkaclient.Producer(k)
	_ = cm.SetKey("client.id", k.ClientID+"-outcomes")
	p, err := kafka.NewProducer(cm)
	if err != nil {
		return nil, fmt.Errorf("outcomes producer: %w", err)
	}
	w := &Writer{p: p, topic: topic, log: log, wait: 10 * time.Second,
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfpipe_outcomes_written_total",
			Help: "Outcome records (a message's outcome and its replies) written to archive.outcomes_topic for the conversation archive."}),
		unrecorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfpipe_outcomes_unrecorded_total",
			Help: "Outcome records Kafka did not take in time: the message is finished, the archive will not show its outcome or replies."})}
	if reg != nil {
		for _, c := range []prometheus.Collector{w.written, w.unrecorded} {
			_ = reg.Register(c)
		}
	}
	// Delivery reports go to each Write's channel; this drains the rest
	// (errors of the client itself).
	go func() {
		for ev := range p.Events() {
			if e, ok := ev.(kafka.Error); ok {
				log.Warn("outcomes producer", zap.Error(e))
			}
		}
	}()
	return w, nil
}

// Write writes recs and waits for Kafka to take them (acks=all), at most
// the writer's bound; it returns the first failure.
func (w *Writer) Write(ctx context.Context, recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	done := make(chan kafka.Event, len(recs))
	sent := 0
	var errs []error
	for i := range recs {
		recs[i].V = 1
		b, err := json.Marshal(recs[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &w.topic, Partition: kafka.PartitionAny},
			Key: []byte(recs[i].User), Value: b}
		if err := w.p.Produce(m, done); err != nil {
			errs = append(errs, err)
			continue
		}
		sent++
	}
	t := time.NewTimer(w.wait)
	defer t.Stop()
	for ; sent > 0; sent-- {
		select {
		case ev := <-done:
			if m, ok := ev.(*kafka.Message); ok && m.TopicPartition.Error != nil {
				errs = append(errs, m.TopicPartition.Error)
			} else {
				w.written.Inc()
			}
		case <-t.C:
			errs = append(errs, fmt.Errorf("not delivered within %s", w.wait))
			sent = 1
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
			sent = 1
		}
	}
	if err := errors.Join(errs...); err != nil {
		w.unrecorded.Add(float64(len(errs)))
		return fmt.Errorf("outcomes topic %s: %w", w.topic, err)
	}
	return nil
}

// Close flushes what is queued (up to ctx's deadline) and closes the
// producer.
func (w *Writer) Close(ctx context.Context) {
	ms := 5000
	if d, ok := ctx.Deadline(); ok {
		ms = max(0, int(time.Until(d).Milliseconds()))
	}
	w.p.Flush(ms)
	w.p.Close()
}

// Wrap records each call of h: the outcome of its message (of every
// message of a batch call) when it succeeded, and the replies it made,
// failed calls included (their replies reached the customer). It waits
// for the record's delivery before it returns, so a consumer killed
// before the record is written has not finished the message either: the
// message runs again, its replies are found sent (skipped) and recorded
// then. A record Kafka does not take in time is logged and counted
// (kfpipe_outcomes_unrecorded_total); the message stays finished, the
// archive's outcome for it is missing — never the message itself, which
// the archiver reads from the main topic.
func Wrap(h handler.Handler, w *Writer) handler.Handler {
	if w == nil {
		return h
	}
	return handler.HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		c := &collector{}
		err := h.Handle(WithSink(ctx, c.add), m)
		items := handler.BatchFrom(ctx)
		if len(items) == 0 {
			items = []handler.BatchItem{{Msg: m, Delivery: handler.DeliveryFrom(ctx)}}
		}
		replies := c.take()
		if err != nil && len(replies) == 0 {
			return err
		}
		now := time.Now().UTC()
		recs := make([]Record, 0, len(items))
		for i, it := range items {
			if it.Msg == nil || it.Msg.UpstreamMsgID == "" {
				continue
			}
			r := Record{MsgID: it.Msg.UpstreamMsgID, OpenKfID: it.Msg.OpenKfID, User: it.Msg.ExternalUserID,
				SendTime: it.Msg.SendTime, Retry: it.Delivery.RetryCount, At: now}
			if err == nil {
				r.Outcome = Handled
				if it.Delivery.RetryFromDLQ {
					r.Outcome = Recovered
				}
			}
			if i == 0 {
				// A batch's replies are keyed by its first message.
				r.Replies = replies
			}
			if r.Outcome != "" || len(r.Replies) > 0 {
				recs = append(recs, r)
			}
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.wait)
		defer cancel()
		if werr := w.Write(wctx, recs...); werr != nil {
			w.log.Warn("outcome not recorded for the archive; the message is finished",
				zap.String("upstream_msgid", m.UpstreamMsgID), zap.String("user_id", m.ExternalUserID), zap.Error(werr))
		}
		return err
	})
}
