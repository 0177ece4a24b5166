package consumer

import (
	"fmt"
	"sync/atomic"
	"time"

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

// SetStandby takes the consumer out of its group (on) or back in (off).
//
// A consumer that cannot protect effects — its Redis is unreachable while
// the other members still have theirs — should not keep partitions it
// cannot process: its users would wait for its Redis to return although
// another member could serve them. On standby it unsubscribes; the revoke
// drains what can finish (processor drain limit), commits the finished
// prefix, and the partitions go to the other members, whose dedup claims
// wait for any claim this one still holds (I3). When every member loses
// Redis they all stand by, which costs nothing more than the outage: no
// member could process anyway. Off subscribes again (a rebalance gives it
// partitions back). The change is applied by the poll goroutine within a
// poll (≤ 100 ms).
func (c *Consumer) SetStandby(on bool, reason string) {
	if on {
		c.sb.reason.Store(&reason)
	}
	c.sb.want.Store(on)
}

// StandbyDetail is the /readyz line while on standby ("" otherwise).
func (c *Consumer) StandbyDetail() string {
	since := c.sb.since.Load()
	if since == 0 {
		return ""
	}
	reason := ""
	if r := c.sb.reason.Load(); r != nil {
		reason = *r
	}
	return fmt.Sprintf("left the consumer group %s ago: %s; it joins again when that clears",
		c.clock.Now().Sub(time.Unix(0, since)).Round(time.Second), reason)
}

// applyStandby makes the group membership follow SetStandby (poll
// goroutine).
func (c *Consumer) applyStandby() {
	want := c.sb.want.Load()
	if want == c.sb.on || c.closing.Load() {
		return
	}
	if want {
		reason := ""
		if r := c.sb.reason.Load(); r != nil {
			reason = *r
		}
		c.log.Warn("leaving the consumer group (standby): its partitions go to the other members", zap.String("reason", reason))
		if err := c.kc.Unsubscribe(); err != nil {
			c.log.Error("standby: unsubscribe", zap.Error(err))
			return
		}
		c.sb.since.Store(c.clock.Now().UnixNano())
		c.m.standby.Set(1)
		c.m.standbys.Inc()
	} else {
		if err := c.kc.SubscribeTopics([]string{c.topic}, c.rebalance); err != nil {
			c.log.Error("standby over: subscribe", zap.Error(err))
			return
		}
		c.log.Info("joining the consumer group again (standby over)")
		c.sb.since.Store(0)
		c.m.standby.Set(0)
	}
	c.sb.on = want
}
