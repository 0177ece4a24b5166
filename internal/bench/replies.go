package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/kf"
)

// Replies measures what exactly-once replies cost: the full consumer reads
// one pre-filled topic (each run in a group of its own) with a handler
// that sends one reply per message to the fake WeChat through
// reply.Do (claim, send_msg, done mark), and with the same handler whose
// reply call is stubbed out, alternating stub, reply, stub, reply in one
// process. The fake WeChat runs in a child process (replyfake.go) and
// answers at once: cpu_us_per_msg is the consumer process's own, the
// fake's is fake_wechat_cpu_us_per_msg apart, and our_cpu_us_per_reply and
// redis_cpu_us_per_reply are the reply runs' figures over the stubbed
// runs'. A real WeChat's round trip adds latency, not CPU.
func Replies(e *Env, o ConsumerOptions) (Result, error) {
	topic, err := e.Topic("replies", o.Partitions)
	if err != nil {
		return Result{}, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return Result{}, err
	}
	msgs := Messages(e.Prefix+"-r", o.Msgs, o.Users)
	if err := Prefill(kcfg, topic, msgs); err != nil {
		return Result{}, fmt.Errorf("prefill: %w", err)
	}
	account := msgs[0].OpenKfID
	msgs = nil

	type run struct {
		rate, cpu, redis, fake, calls float64
	}
	one := func(name string, withReply bool) (run, error) {
		// A fake WeChat of its own (the runs send the same msgids), in a
		// child process: its CPU is not ours.
		fake, err := startReplyFake(context.Background(), account, o.Users)
		if err != nil {
			return run{}, err
		}
		defer fake.close()
		kc, err := kf.New(kf.Config{BaseURL: fake.URL, CorpID: fake.CorpID, Secret: fake.Secret})
		if err != nil {
			return run{}, err
		}
		fx := reply.New(kc, nil)
		h := &counter{target: int64(o.Msgs)}
		send := func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
			_, err := kc.Send(ctx, to.OpenKfID, to.User, msgID, kf.Text{Content: "Thanks, we got your message."})
			return err
		}
		handler := handler.HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
			if withReply {
				if err := reply.Do(ctx, "reply", send); err != nil {
					return err
				}
			}
			return h.Handle(ctx, m)
		})
		f0, err := fake.stats()
		if err != nil {
			return run{}, err
		}
		cpu0, redis0 := CPUTime(), e.RedisCPU()
		stopCount := e.countCalls("")
		sc, _, err := e.startConsumer(name, topic, reply.Wrap(handler, fx), nil)
		if err != nil {
			return run{}, err
		}
		ok := waitUntil(5*time.Minute, func() bool { return h.n.Load() >= int64(o.Msgs) })
		counted := stopCount()
		cpu, redisCPU := CPUTime()-cpu0, e.RedisCPU()-redis0
		var calls int64
		for _, m := range counted {
			for name, n := range m {
				if name != "info" {
					calls += n
				}
			}
		}
		f1, ferr := fake.stats()
		cerr := sc.Close(context.Background())
		if !ok {
			return run{}, fmt.Errorf("%s: %d of %d handled", name, h.n.Load(), o.Msgs)
		}
		if cerr != nil {
			return run{}, cerr
		}
		if sent, _, refused, failed := fx.Counts(); withReply && (sent != o.Msgs || refused+failed > 0) {
			return run{}, fmt.Errorf("%s: %d replies sent, %d refused, %d failed for %d messages", name, sent, refused, failed, o.Msgs)
		}
		if ferr != nil {
			return run{}, ferr
		}
		if got, want := f1.Replies, map[bool]int{true: o.Msgs}[withReply]; got != want || f1.Duplicates != 0 {
			return run{}, fmt.Errorf("%s: the fake delivered %d replies (%d repeats), want %d", name, got, f1.Duplicates, want)
		}
		first, last := time.Unix(0, h.firstAt.Load()), time.Unix(0, h.lastAt.Load())
		return run{rate: float64(o.Msgs) / last.Sub(first).Seconds(),
			cpu:   float64(cpu.Microseconds()) / float64(o.Msgs),
			redis: float64(redisCPU.Microseconds()) / float64(o.Msgs),
			fake:  float64(f1.CPUus-f0.CPUus) / float64(o.Msgs),
			calls: float64(calls) / float64(o.Msgs)}, nil
	}
	var stub, with []run
	for i := range 2 {
		r, err := one(fmt.Sprintf("stub%d", i), false)
		if err != nil {
			return Result{}, err
		}
		stub = append(stub, r)
		if r, err = one(fmt.Sprintf("reply%d", i), true); err != nil {
			return Result{}, err
		}
		with = append(with, r)
	}
	mean := func(rs []run, f func(run) float64) float64 {
		var s float64
		for _, r := range rs {
			s += f(r)
		}
		return s / float64(len(rs))
	}
	rate := func(r run) float64 { return r.rate }
	cpu := func(r run) float64 { return r.cpu }
	redisCPU := func(r run) float64 { return r.redis }
	fakeCPU := func(r run) float64 { return r.fake }
	calls := func(r run) float64 { return r.calls }
	rw, rs := mean(with, rate), mean(stub, rate)
	return Result{Scenario: "consumer_replies", Msgs: o.Msgs, MsgsPerSec: round(rw, 0),
		Baseline: "consumer_reply_stubbed", BaselineMsgsPerSec: round(rs, 0), Ratio: round(rw/rs, 3), RSSMiB: RSSMiB(),
		Extra: map[string]any{"users": o.Users, "partitions": o.Partitions, "runs_each": len(with),
			"ratios":         []float64{round(with[0].rate/stub[0].rate, 3), round(with[1].rate/stub[1].rate, 3)},
			"cpu_us_per_msg": round(mean(with, cpu), 2), "stub_cpu_us_per_msg": round(mean(stub, cpu), 2),
			"redis_cpu_us_per_msg": round(mean(with, redisCPU), 2), "stub_redis_cpu_us_per_msg": round(mean(stub, redisCPU), 2),
			"fake_wechat_cpu_us_per_msg": round(mean(with, fakeCPU), 2),
			"our_cpu_us_per_reply":       round(mean(with, cpu)-mean(stub, cpu), 2),
			"redis_cpu_us_per_reply":     round(mean(with, redisCPU)-mean(stub, redisCPU), 2),
			"redis_calls_per_msg":        round(mean(with, calls), 3), "stub_redis_calls_per_msg": round(mean(stub, calls), 3),
			"redis_calls_per_reply": round(mean(with, calls)-mean(stub, calls), 3),
			"path":                  "service.StartConsumer + reply.Do (once claim, send_msg to the fake WeChat in a child process, done mark) per message"}}, nil
}
