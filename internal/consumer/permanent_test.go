package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/kf"
)

// TestWeChatPermanentErrcodeDeadLettersAtOnce: a handler that returns the
// WeChat client's refusal as is (a reply past the 5-in-48h limit, wrapped
// but not marked Permanent) dead-letters its message at once as
// handler_rejected, as Permanent would; a retryable errcode (45009) is
// retried and dead-lettered as downstream_error after the attempts.
func TestWeChatPermanentErrcodeDeadLettersAtOnce(t *testing.T) {
	tests := []struct {
		name         string
		err          error
		wantReason   string
		wantAttempts int64
	}{
		{"reply limit", fmt.Errorf("reply: %w", &kf.Error{API: "send_msg", Code: kf.CodeReplyLimit}), ReasonHandlerRejected, 1},
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

// TestRefusalIsNotAnInvalidRecord: a handler's Permanent refusal of a
// message that decoded fine is dead-lettered as handler_rejected (the bot
// refused it for good, the record is not broken: past the limiter, not
// recoverable), while a record that cannot be decoded stays
// invalid_message (judged again at re-injection). Both are dead-lettered
// at once and their offsets finished.
func TestRefusalIsNotAnInvalidRecord(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		calls.Add(1)
		return handler.Permanent(errors.New("the bot refused it"))
	})
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, newMemState())
	envs := batchEnvs(p, "u", 2)
	envs[0].msg, envs[0].km.Value = nil, []byte("not json")
	for _, env := range envs {
		c.proc.process(env)
	}
	dlq.wg.Wait()
	if calls.Load() != 1 {
		t.Fatalf("handler called %d times, want once (the good record, not retried)", calls.Load())
	}
	want := map[int64]string{0: ReasonInvalidMessage, 1: ReasonHandlerRejected}
	letters := dlq.all()
	if len(letters) != len(want) {
		t.Fatalf("dead letters %+v, want one per record", letters)
	}
	for _, l := range letters {
		r := deadletter.Reason(l.Reason)
		if string(r) != want[l.SourceOffset] || deadletter.IsRecoverable(r) ||
			deadletter.PastLimiter(r) != (r == deadletter.HandlerRejected) {
			t.Errorf("letter at offset %d: reason %s (recoverable %v, past the limiter %v), want %s",
				l.SourceOffset, r, deadletter.IsRecoverable(r), deadletter.PastLimiter(r), want[l.SourceOffset])
		}
	}
	if next, ok := p.tracker.Committable(); !ok || next != 2 {
		t.Fatalf("offsets not finished after the dead letters: %d %v", next, ok)
	}
}
