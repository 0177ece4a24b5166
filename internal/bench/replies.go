package bench

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// Replies measures what exactly-once replies cost: the full consumer reads
// one pre-filled topic (each run in a group of its own) with a handler
// that sends one reply per message to the fake WeChat through
// reply.Do (claim, send_msg, done mark), and with the same handler whose
// reply call is stubbed out, alternating stub, reply, stub, reply in one
// process. The fake WeChat runs in this process (its CPU is counted in
// cpu_us_per_msg) and answers at once; a real WeChat's round trip adds
// latency, not CPU.
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
		rate, cpu, redis float64
	}
	one := func(name string, withReply bool) (run, error) {
		// A fake WeChat of its own: the runs send the same msgids.
		fake := wecomtest.NewHandler(wecomtest.Options{Accounts: []string{account}, ReplyQuota: 1 << 30})
		srv := httptest.NewServer(fake)
		defer srv.Close()
		for u := range o.Users { // each customer wrote first: the session is open
			fake.AddText(account, UserName(u), "hi")
		}
		kc, err := kf.New(kf.Config{BaseURL: srv.URL, CorpID: fake.CorpID(), Secret: fake.Secret()})
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
		cpu0, redis0 := CPUTime(), e.RedisCPU()
		sc, _, err := e.startConsumer(name, topic, reply.Wrap(handler, fx), nil)
		if err != nil {
			return run{}, err
		}
		ok := waitUntil(5*time.Minute, func() bool { return h.n.Load() >= int64(o.Msgs) })
		cpu, redisCPU := CPUTime()-cpu0, e.RedisCPU()-redis0
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
		if got, want := len(fake.Replies("", "")), map[bool]int{true: o.Msgs}[withReply]; got != want || fake.DuplicateMsgIDs() != 0 {
			return run{}, fmt.Errorf("%s: the fake delivered %d replies (%d repeats), want %d", name, got, fake.DuplicateMsgIDs(), want)
		}
		first, last := time.Unix(0, h.firstAt.Load()), time.Unix(0, h.lastAt.Load())
		return run{rate: float64(o.Msgs) / last.Sub(first).Seconds(),
			cpu:   float64(cpu.Microseconds()) / float64(o.Msgs),
			redis: float64(redisCPU.Microseconds()) / float64(o.Msgs)}, nil
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
	rw, rs := mean(with, rate), mean(stub, rate)
	return Result{Scenario: "consumer_replies", Msgs: o.Msgs, MsgsPerSec: round(rw, 0),
		Baseline: "consumer_reply_stubbed", BaselineMsgsPerSec: round(rs, 0), Ratio: round(rw/rs, 3), RSSMiB: RSSMiB(),
		Extra: map[string]any{"users": o.Users, "partitions": o.Partitions, "runs_each": len(with),
			"ratios":         []float64{round(with[0].rate/stub[0].rate, 3), round(with[1].rate/stub[1].rate, 3)},
			"cpu_us_per_msg": round(mean(with, cpu), 2), "stub_cpu_us_per_msg": round(mean(stub, cpu), 2),
			"redis_cpu_us_per_msg": round(mean(with, redisCPU), 2), "stub_redis_cpu_us_per_msg": round(mean(stub, redisCPU), 2),
			"path": "service.StartConsumer + reply.Do (once claim, send_msg to the in-process fake WeChat, done mark) per message"}}, nil
}
