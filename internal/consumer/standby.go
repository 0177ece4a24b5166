package consumer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
)

// standby is the consumer's wish to be out of its group, set from any
// goroutine (SetStandby) and applied by the poll goroutine, which alone
// may subscribe and unsubscribe.
type standby struct {
	want   atomic.Bool
	reason atomic.Pointer[string]
	since  atomic.Int64 // unix nanoseconds of the last leave; 0 while in the group
	on     bool         // poll goroutine: out of the group now
}

// set records the wish: on, out of the group for reason; off, back in.
func (s *standby) set(on bool, reason string) {
	if on {
		s.reason.Store(&reason)
	}
	s.want.Store(on)
}

// detail is the /readyz line while on standby ("" otherwise).
func (s *standby) detail(now time.Time) string {
	since := s.since.Load()
	if since == 0 {
		return ""
	}
	reason := ""
	if r := s.reason.Load(); r != nil {
		reason = *r
	}
	return fmt.Sprintf("left the consumer group %s ago: %s; it joins again when that clears",
		now.Sub(time.Unix(0, since)).Round(time.Second), reason)
}

// apply makes the group membership follow SetStandby (poll goroutine,
// not while closing).
func (s *standby) apply(k *core, kc *kafka.Consumer, rebalance kafka.RebalanceCb) {
	want := s.want.Load()
	if want == s.on {
		return
	}
	if want {
		reason := ""
		if r := s.reason.Load(); r != nil {
			reason = *r
		}
		k.log.Warn("leaving the consumer group (standby): its partitions go to the other members", zap.String("reason", reason))
		if err := kc.Unsubscribe(); err != nil {
			k.log.Error("standby: unsubscribe", zap.Error(err))
			return
		}
		s.since.Store(k.clock.Now().UnixNano())
		k.m.part.standby.Set(1)
		k.m.part.standbys.Inc()
	} else {
		if err := kc.SubscribeTopics([]string{k.topic}, rebalance); err != nil {
			k.log.Error("standby over: subscribe", zap.Error(err))
			return
		}
		k.log.Info("joining the consumer group again (standby over)")
		s.since.Store(0)
		k.m.part.standby.Set(0)
	}
	s.on = want
}
