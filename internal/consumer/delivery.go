package consumer

import (
	"context"
	"strconv"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Delivery is what a record's headers say about this delivery of its
// message: whether the DLQ's recovery put it back on the main topic, and
// how many times that has happened.
type Delivery struct {
	RetryFromDLQ bool
	RetryCount   int
}

type deliveryKey struct{}

// withDelivery returns ctx carrying the Delivery of record km (ctx itself
// for a first delivery).
func withDelivery(ctx context.Context, km *kafka.Message) context.Context {
	if km == nil {
		return ctx
	}
	var d Delivery
	for _, h := range km.Headers {
		switch h.Key {
		case chatmsg.HeaderRetryFromDLQ:
			d.RetryFromDLQ = string(h.Value) == "true"
		case chatmsg.HeaderRetryCount:
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n > 0 {
				d.RetryCount = n
			}
		}
	}
	if d == (Delivery{}) {
		return ctx
	}
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFrom returns the Delivery of the message a handler call handles
// (the zero Delivery for a first delivery).
func DeliveryFrom(ctx context.Context) Delivery {
	d, _ := ctx.Value(deliveryKey{}).(Delivery)
	return d
}
