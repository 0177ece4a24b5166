package consumer

import (
	"strconv"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// TestLimitAt: which records the limiter judges, and by which time. A fresh
// record is judged at its send time; a re-injected one whose failure came
// after the limiter's yes is not judged again; one the limiter or the
// breaker refused is judged at its re-injection (produce) time.
func TestLimitAt(t *testing.T) {
	c, _ := unitConsumer(t, NoopHandler, &memDLQ{}, nil)
	sent := time.Unix(1_900_000_000, 0)
	produced := sent.Add(10 * time.Minute)
	rec := func(hs ...string) *kafka.Message {
		km := &kafka.Message{Timestamp: produced, TimestampType: kafka.TimestampCreateTime,
			Headers: []kafka.Header{{Key: chatmsg.HeaderSendTime, Value: []byte(strconv.FormatInt(sent.Unix(), 10))}}}
		for i := 0; i+1 < len(hs); i += 2 {
			km.Headers = append(km.Headers, kafka.Header{Key: hs[i], Value: []byte(hs[i+1])})
		}
		return km
	}
	retry := func(reason string) *kafka.Message {
		return rec(chatmsg.HeaderRetryFromDLQ, "true", chatmsg.HeaderRetryCount, "1", chatmsg.HeaderOriginalFailure, reason)
	}
	tests := []struct {
		name  string
		km    *kafka.Message
		judge bool
		at    time.Time
	}{
		{"fresh", rec(), true, sent},
		{"retry header not true", rec(chatmsg.HeaderRetryFromDLQ, "false", chatmsg.HeaderOriginalFailure, ReasonDownstreamError), true, sent},
		{"downstream_error", retry(ReasonDownstreamError), false, time.Time{}},
		{"process_timeout", retry(ReasonProcessTimeout), false, time.Time{}},
		{"queue_full", retry(ReasonQueueFull), false, time.Time{}},
		{"handler_rejected", retry(ReasonHandlerRejected), false, time.Time{}},
		{"rate_limited", retry(ReasonRateLimited), true, produced},
		{"user_blocked", retry(ReasonUserBlocked), true, produced},
		{"circuit_open", retry(ReasonCircuitOpen), true, produced},
		{"invalid_message", retry(ReasonInvalidMessage), true, produced},
		{"no original_failure", rec(chatmsg.HeaderRetryFromDLQ, "true"), true, produced},
	}
	for _, tt := range tests {
		at, judge := c.poll.limitAt(tt.km)
		if judge != tt.judge || !at.Equal(tt.at) {
			t.Errorf("%s: judge=%v at %s, want %v at %s", tt.name, judge, at, tt.judge, tt.at)
		}
	}
	km := retry(ReasonRateLimited)
	km.TimestampType, km.Timestamp = kafka.TimestampNotAvailable, time.Time{}
	before := time.Now()
	if at, judge := c.poll.limitAt(km); !judge || at.Before(before) || at.After(time.Now()) {
		t.Errorf("retry without a timestamp: judge=%v at %s, want the consumer's clock", judge, at)
	}
}
