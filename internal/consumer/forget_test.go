package consumer

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// rlLimiter adapts ratelimit.Limiter for the test as the service does.
type rlLimiter struct{ l *ratelimit.Limiter }

func (r rlLimiter) Allow(ctx context.Context, user string, now time.Time) Verdict {
	d := r.l.Allow(ctx, user, now)
	return Verdict{Allowed: d.Allowed, Reason: d.Reason}
}

func (r rlLimiter) Forget(user string) { r.l.Forget(user) }

// TestIdleActorForgetsUserState: the limiter's and the breaker's per-user
// state lives as long as the user's actor. 20,000 users send one message
// each; after the actors' idle timeout the state is gone and the heap is
// back near where it started. Before, Forget had no caller and every user
// ever seen kept ~384 B for the life of the process.
func TestIdleActorForgetsUserState(t *testing.T) {
	const users = 20000
	rl, err := ratelimit.New(config.RateLimit{Enabled: true, DefaultGroup: "normal",
		Groups: map[string]config.RateGroup{"normal": {WindowSeconds: 10, MaxMessages: 5, PenaltyThreshold: 3, BlockHours: 1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	br, err := ratelimit.NewBreakers(config.Breaker{FailureThreshold: 100, OpenTimeout: 30 * time.Second, HalfOpenMax: 5})
	if err != nil {
		t.Fatal(err)
	}
	c, p := unitConsumer(t, NoopHandler, &memDLQ{}, nil)
	c.acts = newRegistry(4, 3*time.Second, nil, c.proc.process, nil)
	c.poll = newPoller(c.core, nil, c.own, c.acts, rlLimiter{rl}, br, c.dead, c.commits)
	c.acts.onIdle = c.poll.forget
	defer c.acts.close()

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	off := 0
	wave := func(name string) uint64 {
		for i := range users {
			user := fmt.Sprintf("%s-%05d", name, i)
			p.tracker.Add(int64(off))
			m := &chatmsg.ChatMessage{UpstreamMsgID: user, OpenKfID: "wk", ExternalUserID: user, MsgType: "text"}
			c.poll.route(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(off)}, Timestamp: time.Now(),
				TimestampType: kafka.TimestampCreateTime}, msg: m, part: p, user: user})
			off++
		}
		// Some actors may already have ended on a slow machine, not all.
		if rl.Users() == 0 || br.Users() == 0 {
			t.Fatalf("no state for any of %d users right after their messages", users)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			a, l, b := c.acts.len(), rl.Users(), br.Users()
			return testenv.Check(a == 0 && l == 0 && b == 0, "%s wave: %d actors, limiter state of %d users, breaker state of %d users; want none", name, a, l, b)
		})
		return heap()
	}
	base := heap()
	first := wave("first")
	second := wave("second") // as many new users again
	t.Logf("heap %d KiB at start, %d KiB after %d users came and went, %d KiB after %d more",
		base>>10, first>>10, users, second>>10, users)
	// What stays after the first wave is the maps' and the offset
	// tracker's capacity for the peak; users that come and go later cost
	// nothing more (before: ~390 B for every user ever seen).
	// The heap is the process's: other tests' leftovers can add to one
	// wave. A leak grows with every wave, so a third one decides.
	if second > first+users*32 {
		third := wave("third")
		t.Logf("%d KiB after a third wave", third>>10)
		if third > second+users*32 {
			t.Fatalf("heap grew by %d and %d B per user of the second and third waves after their actors ended",
				(second-first)/users, (third-second)/users)
		}
	}
}
