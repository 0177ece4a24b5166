package consumer

import (
	"context"
	"strconv"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
)

// withDelivery returns ctx carrying the handler.Delivery of record km (ctx itself
// for a first delivery).
func withDelivery(ctx context.Context, km *kafka.Message) context.Context {
	if km == nil {
		return ctx
	}
	var d handler.Delivery
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
	return handler.WithDelivery(ctx, d)
}
