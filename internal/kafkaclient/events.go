package kafkaclient

import (
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Events says what a producer does with the events of its Events channel;
// DrainEvents reads them. T is the type the producer gives its records as
// Opaque: only the delivery reports of those reach Delivered.
type Events[T any] struct {
	// Delivered gets each delivery report: the record's Opaque and its
	// error (nil: delivered). It runs on the loop's goroutine, so it must
	// not block for long: librdkafka's queue fills behind it.
	Delivered func(op T, err error)
	// Stats gets the statistics JSON (statistics.interval.ms); nil ignores
	// it.
	Stats func(json string)
	// Fatal is told of a fatal error after it is logged at error level:
	// every later produce fails too. nil only logs it.
	Fatal func(kafka.Error)
	// Log logs kafka.Error events (nil: none): a fatal one at error level,
	// others at ErrorLevel — informational, since librdkafka keeps retrying
	// and the failures that matter come back as delivery reports.
	Log        *zap.Logger
	ErrorLevel zapcore.Level
	// Name starts the log messages ("dlq producer" logs "dlq producer
	// error" and "dlq producer fatal error").
	Name string
}

// DrainEvents is the one reader of a producer's Events channel: it hands
// each event to ev and returns when the channel is closed (the producer's
// Close). Run it on a goroutine of its own, started before the first
// Produce.
func DrainEvents[T any](events <-chan kafka.Event, ev Events[T]) {
	log := ev.Log
	if log == nil {
		log = zap.NewNop()
	}
	for e := range events {
		switch e := e.(type) {
		case *kafka.Message:
			if op, ok := e.Opaque.(T); ok && ev.Delivered != nil {
				ev.Delivered(op, e.TopicPartition.Error)
			}
		case *kafka.Stats:
			if ev.Stats != nil {
				ev.Stats(e.String())
			}
		case kafka.Error:
			if e.IsFatal() {
				log.Error(ev.Name+" fatal error", zap.Error(e))
				if ev.Fatal != nil {
					ev.Fatal(e)
				}
				continue
			}
			log.Log(ev.ErrorLevel, ev.Name+" error", zap.Error(e))
		}
	}
}
