package consumer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/kf"
)

// TestWeChatPermanentErrcodeDeadLettersAtOnce: a handler that returns the
// WeChat client's refusal as is (a reply past the 5-in-48h limit, wrapped
// but not marked Permanent) dead-letters its message at once as
// invalid_message, as Permanent would; a retryable errcode (45009) is
// retried and dead-lettered as downstream_error after the attempts.
func TestWeChatPermanentErrcodeDeadLettersAtOnce(t *testing.T) {
	tests := []struct {
		name         string
		err          error
		wantReason   string
		wantAttempts int64
	}{
		{"reply limit", fmt.Errorf("reply: %w", &kf.Error{API: "send_msg", Code: kf.CodeReplyLimit}), ReasonInvalidMessage, 1},
		{"frequency limit", fmt.Errorf("reply: %w", &kf.Error{API: "send_msg", Code: kf.CodeFrequencyLimit}), ReasonDownstreamError, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int64
			h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
				calls.Add(1)
				return tt.err
			})
			dlq := &memDLQ{}
			c, p := unitConsumer(t, h, dlq, newMemState())
			p.tracker.Add(7)
			done, _ := (&fakeBreaker{}).Allow("u")
			env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 7}}, msg: chat("u", 1), part: p, breakerDone: done}
			c.proc.process(env)
			dlq.wg.Wait()
			letters := dlq.all()
			if calls.Load() != tt.wantAttempts || len(letters) != 1 || string(letters[0].Reason) != tt.wantReason {
				t.Fatalf("handler called %d times, dead letters %+v; want %d call(s) and one %s letter",
					calls.Load(), letters, tt.wantAttempts, tt.wantReason)
			}
		})
	}
}
