package kafkaclient

import (
	"errors"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestDrainEvents: each delivery report whose Opaque is the producer's
// type reaches Delivered with its error, others are skipped; statistics
// reach Stats; a fatal error is logged at error level and handed to Fatal,
// a non-fatal one logged at the level asked; the loop ends when the
// channel closes.
func TestDrainEvents(t *testing.T) {
	type job struct{ n int }
	ch := make(chan kafka.Event, 8)
	topic := "t"
	failed := errors.New("delivery failed")
	ch <- &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic}, Opaque: &job{1}}
	ch <- &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Error: failed}, Opaque: &job{2}}
	ch <- &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic}, Opaque: "someone else's"}
	ch <- &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic}}
	ch <- &kafka.Stats{}
	ch <- kafka.NewError(kafka.ErrTransport, "broker down", false)
	ch <- kafka.NewError(kafka.ErrFatal, "fenced", true)
	close(ch)

	core, logs := observer.New(zapcore.DebugLevel)
	var delivered []int
	var errs []error
	stats, fatal := 0, 0
	DrainEvents(ch, Events[*job]{
		Delivered: func(j *job, err error) { delivered, errs = append(delivered, j.n), append(errs, err) },
		Stats:     func(string) { stats++ },
		Fatal:     func(kafka.Error) { fatal++ },
		Log:       zap.New(core), ErrorLevel: zapcore.WarnLevel, Name: "test producer",
	})
	if len(delivered) != 2 || delivered[0] != 1 || delivered[1] != 2 || errs[0] != nil || !errors.Is(errs[1], failed) {
		t.Fatalf("delivered %v with errors %v, want jobs 1 (ok) and 2 (failed)", delivered, errs)
	}
	if stats != 1 || fatal != 1 {
		t.Fatalf("stats %d, fatal %d; want 1 each", stats, fatal)
	}
	warn := logs.FilterMessage("test producer error").FilterLevelExact(zapcore.WarnLevel).Len()
	fat := logs.FilterMessage("test producer fatal error").FilterLevelExact(zapcore.ErrorLevel).Len()
	if warn != 1 || fat != 1 || logs.Len() != 2 {
		t.Fatalf("logs %v: want one warning and one fatal error", logs.All())
	}
}

// TestDrainEventsNothingAsked: with no callbacks and no logger every event
// is read and dropped, and the loop still ends with the channel.
func TestDrainEventsNothingAsked(t *testing.T) {
	ch := make(chan kafka.Event, 3)
	ch <- &kafka.Message{Opaque: struct{}{}}
	ch <- &kafka.Stats{}
	ch <- kafka.NewError(kafka.ErrFatal, "fenced", true)
	close(ch)
	DrainEvents(ch, Events[struct{}]{})
	if len(ch) != 0 {
		t.Fatalf("%d events left unread", len(ch))
	}
}
