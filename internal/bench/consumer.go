package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/service"
)

// startConsumer starts the full schedule-consumer (service.StartConsumer:
// the per-partition state store, ratelimit limiter, breakers, DLQ producer) on topic
// with h, after mutate adjusts the configuration. It returns the
// consumer's metrics registry too.
func (e *Env) startConsumer(name, topic string, h handler.Handler, mutate func(*config.Consumer)) (*service.Consumer, prometheus.Gatherer, error) {
	dlqTopic, err := e.Topic(name+"-dlq", 2)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := e.ConsumerConfig(name, topic, dlqTopic)
	if err != nil {
		return nil, nil, err
	}
	if mutate != nil {
		mutate(cfg)
		if err := cfg.Validate(); err != nil {
			return nil, nil, err
		}
	}
	base := e.Base(name)
	if cfg.Redis.Mode == "cluster" {
		if e.Cluster == nil {
			return nil, nil, fmt.Errorf("%s: redis.mode cluster without a cluster (Env.ConnectCluster)", name)
		}
		base.Redis = e.Cluster
	}
	s, err := service.StartConsumer(context.Background(), cfg, base, h)
	if err != nil {
		return nil, nil, err
	}
	return s, base.Registry, nil
}

// counter is a handler that counts and, when lat is set, records the
// produce→handle latency from ChatMessage.ProducedAt.
type counter struct {
	n atomic.Int64
	// target, when set, is the count whose arrival time lastAt records;
	// firstAt records the first (Unix ns).
	target          int64
	firstAt, lastAt atomic.Int64
	lat             *Latencies
	// work simulates business work per message.
	work time.Duration
	// only, when set, restricts latency samples to users it accepts.
	only func(user string) bool
}

func (c *counter) Handle(_ context.Context, m *chatmsg.ChatMessage) error {
	if c.lat != nil && m.ProducedAt > 0 && (c.only == nil || c.only(m.ExternalUserID)) {
		c.lat.Add(float64(time.Now().UnixMicro()-m.ProducedAt*1000) / 1000)
	}
	if c.work > 0 {
		time.Sleep(c.work)
	}
	n := c.n.Add(1)
	if n == 1 {
		c.firstAt.Store(time.Now().UnixNano())
	}
	if n == c.target {
		c.lastAt.Store(time.Now().UnixNano())
	}
	return nil
}

// ConsumerOptions sizes the consumer throughput scenario.
type ConsumerOptions struct {
	Msgs       int
	Users      int
	Partitions int
	// Mutate, when set, adjusts the consumer's configuration (diagnostic
	// variants, e.g. the limiter off, to see where the time goes).
	Mutate func(*config.Consumer)
	// Bare runs consumer.New without dedup, limiter and breaker (a
	// diagnostic: the cost of the consumer core alone).
	Bare bool
	// Profile, when set, is called as the pipeline phase starts (after
	// the prefill and the raw loop) and the function it returns as it
	// ends: a CPU profile of the consumer alone.
	Profile func() (stop func())
	// Limit bounds the pipeline phase (3 minutes when zero).
	Limit time.Duration
	// Cluster runs the full consumer on the Redis Cluster (redis.mode:
	// cluster, Env.ConnectCluster); its redisCPU is the masters' summed.
	Cluster bool
}

// noDeadLetters fails every dead letter: the bare variant expects none.
type noDeadLetters struct{ n atomic.Int64 }

func (d *noDeadLetters) Send(_ *chatmsg.DeadLetter, done func(error)) {
	d.n.Add(1)
	done(fmt.Errorf("bench: unexpected dead letter"))
}

type closer interface{ Close(context.Context) error }

func (e *Env) startBare(topic string, h handler.Handler) (*consumer.Consumer, error) {
	cfg, err := e.ConsumerConfig("consume-bare", topic, "unused")
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(*cfg, h, &noDeadLetters{})
	if err != nil {
		return nil, err
	}
	return c, c.Start()
}

// Consumer pre-fills a fresh topic, then reads it with a raw ReadMessage
// loop (raw_consume) and with the full consumer and a no-op handler
// (consumer_pipeline), each in its own group from the start of the topic.
func Consumer(e *Env, o ConsumerOptions) (Result, error) {
	topic, err := e.Topic("consume", o.Partitions)
	if err != nil {
		return Result{}, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return Result{}, err
	}
	msgs := Messages(e.Prefix+"-c", o.Msgs, o.Users)
	size := WireSize(msgs)
	if err := Prefill(kcfg, topic, msgs); err != nil {
		return Result{}, fmt.Errorf("prefill: %w", err)
	}
	msgs = nil

	cpu0 := CPUTime()
	rawFromStart, rawRate, err := rawConsume(kcfg, e.Prefix+"-raw-consume", topic, o.Msgs, 3*time.Minute)
	if err != nil {
		return Result{}, fmt.Errorf("raw_consume: %w", err)
	}
	rawCPU := CPUTime() - cpu0
	ph, err := e.pipelinePhase("consume", topic, o)
	if err != nil {
		return Result{}, err
	}
	rate, fromStart, cpu, redisCPU, rss, active := ph.rate, ph.fromStart, ph.cpu, ph.redisCPU, ph.rss, ph.active
	name := "consumer_pipeline"
	if o.Bare {
		name = "consumer_bare"
	}
	return Result{Scenario: name, Msgs: o.Msgs, MsgsPerSec: round(rate, 0),
		Baseline: "raw_consume", BaselineMsgsPerSec: round(rawRate, 0), Ratio: round(rate/rawRate, 3),
		RSSMiB: rss, Goal: "msgs_per_sec >= 50000 and ratio >= 0.5", Pass: rate >= 50000 && rate/rawRate >= 0.5,
		Extra: map[string]any{"bytes_per_msg": round(size, 0), "users": o.Users, "partitions": o.Partitions,
			"from_start_msgs_per_sec": round(fromStart, 0), "raw_from_start_msgs_per_sec": round(rawFromStart, 0),
			"from_start_ratio": round(fromStart/rawFromStart, 3),
			"actors_at_end":    active, "peak_rss_mib": PeakRSSMiB(),
			// CPU per message: this process (both phases) and the Redis
			// server (the pipeline phase; the raw loop does not use it).
			"cpu_us_per_msg":       round(float64(cpu.Microseconds())/float64(o.Msgs), 2),
			"raw_cpu_us_per_msg":   round(float64(rawCPU.Microseconds())/float64(o.Msgs), 2),
			"redis_cpu_us_per_msg": round(float64(redisCPU.Microseconds())/float64(o.Msgs), 2),
			"path":                 "service.StartConsumer: decode, breaker, limiter (loose group), mailbox, actor, the partition's state store (lease, batched look-ups, done marks), offset tracker commits"}}, nil
}

// phase is what one run of a kfpipe consumer over a prefilled topic
// measured.
type phase struct {
	// rate is from the first record handled to the last, fromStart from
	// the consumer's creation.
	rate, fromStart float64
	// cpu is this process's CPU time and redisCPU the Redis server's
	// during the run.
	cpu, redisCPU time.Duration
	rss           float64
	active        int
}

// pipelinePhase runs kfpipe's consumer (o.Bare: the core alone; else the
// full schedule-consumer, named name) over topic until it handled o.Msgs
// records, and closes it.
func (e *Env) pipelinePhase(name, topic string, o ConsumerOptions) (phase, error) {
	cpu0, redis0 := CPUTime(), e.redisCPUOn(o.Cluster)
	h := &counter{target: int64(o.Msgs)}
	stopProfile := func() {}
	if o.Profile != nil {
		stopProfile = o.Profile()
	}
	start := time.Now()
	var s closer
	var cc *consumer.Consumer
	var err error
	if o.Bare {
		cc, err = e.startBare(topic, h)
		s = cc
	} else {
		var sc *service.Consumer
		mutate := o.Mutate
		if o.Cluster {
			mutate = func(c *config.Consumer) {
				if o.Mutate != nil {
					o.Mutate(c)
				}
				c.Redis.Mode, c.Redis.ClusterAddrs, c.Redis.DB = "cluster", e.ClusterAddrs, 0
			}
		}
		sc, _, err = e.startConsumer(name, topic, h, mutate)
		if sc != nil {
			s, cc = sc, sc.C
		}
	}
	if err != nil {
		return phase{}, err
	}
	limit := o.Limit
	if limit == 0 {
		limit = 3 * time.Minute
	}
	ok := waitUntil(limit, func() bool { return h.n.Load() >= int64(o.Msgs) })
	stopProfile()
	ph := phase{cpu: CPUTime() - cpu0, redisCPU: e.redisCPUOn(o.Cluster) - redis0, rss: RSSMiB(), active: cc.ActiveProcessors()}
	cerr := s.Close(context.Background())
	if !ok {
		return phase{}, fmt.Errorf("%s: %d of %d handled", name, h.n.Load(), o.Msgs)
	}
	if cerr != nil {
		return phase{}, fmt.Errorf("%s close: %w", name, cerr)
	}
	// Throughput from the first record read to the last: what the loop
	// sustains once running. From the start (consumer creation, group
	// join, first fetch) as well.
	first, last := time.Unix(0, h.firstAt.Load()), time.Unix(0, h.lastAt.Load())
	ph.rate = float64(o.Msgs) / last.Sub(first).Seconds()
	ph.fromStart = float64(o.Msgs) / last.Sub(start).Seconds()
	return ph, nil
}

// pacer produces, every 10 ms, the messages due at rate per second through
// the producer path (KafkaProducer.ProduceBatch; ProducedAt is set there).
// next builds the i-th message. It stops after d and waits for the last
// delivery reports.
func pace(kp *producer.KafkaProducer, topic string, rate float64, d time.Duration, next func(i int) *chatmsg.ChatMessage) (int, error) {
	var wg sync.WaitGroup
	var perr atomic.Pointer[error]
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	sent := 0
	for now := range t.C {
		el := now.Sub(start)
		if el >= d {
			break
		}
		due := int(rate * el.Seconds())
		if due <= sent {
			continue
		}
		batch := make([]*chatmsg.ChatMessage, 0, due-sent)
		for ; sent < due; sent++ {
			batch = append(batch, next(sent))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := kp.ProduceBatch(context.Background(), topic, batch); err != nil {
				perr.Store(&err)
			}
		}()
	}
	wg.Wait()
	if p := perr.Load(); p != nil {
		return sent, *p
	}
	return sent, nil
}

// E2ELatency produces at rate msg/s for d through the producer path with a
// full consumer and no-op handler reading, and reports produce→handler
// latency; the baseline is a raw librdkafka producer at the same rate and a
// raw ReadMessage loop.
func E2ELatency(e *Env, rate float64, d time.Duration, users int) (Result, error) {
	// Baseline: raw producer, raw consumer.
	rawTopic, err := e.Topic("e2e-raw", 4)
	if err != nil {
		return Result{}, err
	}
	kcfg, err := e.KafkaConfig(rawTopic, "", "")
	if err != nil {
		return Result{}, err
	}
	var rawLat Latencies
	stop, ready := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- rawLatencyConsumer(kcfg, e.Prefix+"-e2e-raw", rawTopic, &rawLat, stop, ready) }()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		return Result{}, fmt.Errorf("raw consumer not assigned after 30s")
	}
	rp, err := NewRawProducer(kcfg)
	if err != nil {
		return Result{}, err
	}
	pad := "xxxxxxxxxxxxxx"
	start := time.Now()
	tk := time.NewTicker(10 * time.Millisecond)
	sent := 0
	for now := range tk.C {
		el := now.Sub(start)
		if el >= d {
			break
		}
		ms := now.UnixMilli()
		for due := int(rate * el.Seconds()); sent < due; sent++ {
			m := Message(e.Prefix+"-er", sent, UserName(sent%users), pad)
			m.ProducedAt = ms
			if err := rp.Produce(Record(rawTopic, m)); err != nil {
				tk.Stop()
				return Result{}, err
			}
		}
	}
	tk.Stop()
	werr := rp.Wait(sent, time.Minute)
	rp.Close()
	waitUntil(10*time.Second, func() bool { return rawLat.Len() >= sent })
	close(stop)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	if werr != nil {
		return Result{}, werr
	}
	rawSent := sent

	// Pipeline.
	topic, err := e.Topic("e2e", 4)
	if err != nil {
		return Result{}, err
	}
	kcfg.Topics.Main.Name = topic
	var lat Latencies
	h := &counter{}
	s, _, err := e.startConsumer("e2e", topic, h, nil)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = s.Close(context.Background()) }()
	kp, err := producer.NewKafkaProducer(kcfg, nil, e.Log)
	if err != nil {
		return Result{}, err
	}
	// Warm-up: the consumer has joined the group once a message made it.
	if err := kp.ProduceBatch(context.Background(), topic, []*chatmsg.ChatMessage{Message(e.Prefix+"-ew", 0, UserName(0), pad)}); err != nil {
		return Result{}, err
	}
	if !waitUntil(30*time.Second, func() bool { return h.n.Load() >= 1 }) {
		return Result{}, fmt.Errorf("consumer did not handle the warm-up message in 30s")
	}
	h.lat = &lat
	n, err := pace(kp, topic, rate, d, func(i int) *chatmsg.ChatMessage {
		return Message(e.Prefix+"-e", i, UserName(i%users), pad)
	})
	_ = kp.Close(context.Background())
	if err != nil {
		return Result{}, err
	}
	if !waitUntil(30*time.Second, func() bool { return h.n.Load() >= int64(n)+1 }) {
		return Result{}, fmt.Errorf("%d of %d handled", h.n.Load()-1, n)
	}
	p99, rawP99 := lat.Quantile(0.99), rawLat.Quantile(0.99)
	return Result{Scenario: "e2e_latency_5k", Msgs: n, MsgsPerSec: round(float64(n)/d.Seconds(), 0),
		P50Ms: round(lat.Quantile(0.5), 2), P99Ms: round(p99, 2),
		Baseline: "raw_produce_consume", BaselineMsgsPerSec: round(float64(rawSent)/d.Seconds(), 0),
		Ratio: round(p99/rawP99, 2), RSSMiB: RSSMiB(), Goal: "p99_ms <= 25 (seed: < 100)", Pass: p99 <= 25,
		Extra: map[string]any{"ratio_of": "p99 / baseline p99", "baseline_p50_ms": round(rawLat.Quantile(0.5), 2),
			"baseline_p99_ms": round(rawP99, 2), "max_ms": round(lat.Quantile(1), 2), "users": users,
			"note": "ProducedAt has millisecond resolution: samples are biased up by 0-1 ms, in both runs"}}, nil
}

// Memory touches users distinct users (one message each) with the full
// consumer, then measures heap and RSS per known user while the actors are
// alive and idle, and again after their idle timeout removed them.
func Memory(e *Env, users int, idle time.Duration) (Result, error) {
	topic, err := e.Topic("memory", 4)
	if err != nil {
		return Result{}, err
	}
	kcfg, err := e.KafkaConfig(topic, "", "")
	if err != nil {
		return Result{}, err
	}
	if err := Prefill(kcfg, topic, Messages(e.Prefix+"-m", users, users)); err != nil {
		return Result{}, err
	}
	heap0, rss0 := HeapInuse(), RSSMiB()
	h := &counter{}
	start := time.Now()
	s, _, err := e.startConsumer("memory", topic, h, func(c *config.Consumer) { c.Processor.IdleTimeout = idle })
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = s.Close(context.Background()) }()
	if !waitUntil(3*time.Minute, func() bool { return h.n.Load() >= int64(users) }) {
		return Result{}, fmt.Errorf("%d of %d handled", h.n.Load(), users)
	}
	took := time.Since(start)
	time.Sleep(2 * time.Second) // let commits and DLQ/dedup batches settle: idle
	active := s.C.ActiveProcessors()
	heap1, rss1 := HeapInuse(), RSSMiB()
	waitUntil(idle+30*time.Second, func() bool { return s.C.ActiveProcessors() == 0 })
	time.Sleep(time.Second)
	heap2, rss2 := HeapInuse(), RSSMiB()
	perUser := float64(int64(heap1)-int64(heap0)) / float64(users)
	return Result{Scenario: "memory_100k_users", Msgs: users, MsgsPerSec: round(float64(users)/took.Seconds(), 0),
		Baseline: "consumer_before_start", RSSMiB: rss1, Goal: "heap per known user <= 4096 B idle, rss <= 512 MiB",
		Pass: perUser <= 4096 && rss1 <= 512,
		Extra: map[string]any{"heap_per_user_b": round(perUser, 0), "actors_alive": active,
			"heap_per_user_after_idle_b": round(float64(int64(heap2)-int64(heap0))/float64(users), 0),
			"rss_mib_after_idle":         rss2, "rss_mib_before": rss0, "peak_rss_mib": PeakRSSMiB(),
			"heap_mib_before": round(float64(heap0)/(1<<20), 1), "heap_mib_idle": round(float64(heap1)/(1<<20), 1),
			"idle_timeout": idle.String()}}, nil
}

// Isolation runs the normal profile (normal users × 2 msg/min) for d with a
// handler doing 2 ms of work, once alone and once beside attackers (10 ×
// 1000 msg/min), with the shipped rate-limit groups, and compares the normal
// users' p99 produce→handle latency.
func Isolation(e *Env, normal, attackers int, d time.Duration) (Result, error) {
	run := func(name string, withAttack bool) (*Latencies, int64, int, error) {
		topic, err := e.Topic(name, 4)
		if err != nil {
			return nil, 0, 0, err
		}
		kcfg, err := e.KafkaConfig(topic, "", "")
		if err != nil {
			return nil, 0, 0, err
		}
		var lat Latencies
		isNormal := func(u string) bool { return len(u) > 0 && u[0] == 'n' }
		h := &counter{work: 2 * time.Millisecond, only: isNormal}
		s, _, err := e.startConsumer(name, topic, h, func(c *config.Consumer) {
			c.RateLimit.DefaultGroup = "normal" // the shipped default: 30 per 60 s
		})
		if err != nil {
			return nil, 0, 0, err
		}
		defer func() { _ = s.Close(context.Background()) }()
		kp, err := producer.NewKafkaProducer(kcfg, nil, e.Log)
		if err != nil {
			return nil, 0, 0, err
		}
		defer func() { _ = kp.Close(context.Background()) }()
		pad := "xxxxxxxxxxxxxx"
		warm := Message(e.Prefix+"-"+name+"-w", 0, "warmup", pad)
		if err := kp.ProduceBatch(context.Background(), topic, []*chatmsg.ChatMessage{warm}); err != nil {
			return nil, 0, 0, err
		}
		if !waitUntil(30*time.Second, func() bool { return h.n.Load() >= 1 }) {
			return nil, 0, 0, fmt.Errorf("%s: warm-up not handled in 30s", name)
		}
		h.lat = &lat
		normalRate := float64(normal) * 2 / 60
		attackRate := 0.0
		if withAttack {
			attackRate = float64(attackers) * 1000 / 60
		}
		total := normalRate + attackRate
		// Interleave the two classes in proportion to their rates.
		nNormal, nAttack := 0, 0
		sent, err := pace(kp, topic, total, d, func(i int) *chatmsg.ChatMessage {
			if attackRate == 0 || float64(nNormal+1)/normalRate <= float64(nAttack+1)/attackRate {
				nNormal++
				return Message(e.Prefix+"-"+name, i, fmt.Sprintf("n%05d", nNormal%normal), pad)
			}
			nAttack++
			return Message(e.Prefix+"-"+name, i, fmt.Sprintf("a%03d", nAttack%attackers), pad)
		})
		if err != nil {
			return nil, 0, 0, err
		}
		waitUntil(30*time.Second, func() bool { return lat.Len() >= nNormal })
		time.Sleep(500 * time.Millisecond)
		return &lat, h.n.Load() - 1, sent, nil
	}
	base, baseHandled, baseSent, err := run("iso-base", false)
	if err != nil {
		return Result{}, err
	}
	att, attHandled, attSent, err := run("iso-attack", true)
	if err != nil {
		return Result{}, err
	}
	p99, baseP99 := att.Quantile(0.99), base.Quantile(0.99)
	ratio := p99 / baseP99
	return Result{Scenario: "isolation", Msgs: attSent, MsgsPerSec: round(float64(attSent)/d.Seconds(), 0),
		P50Ms: round(att.Quantile(0.5), 2), P99Ms: round(p99, 2), Baseline: "normal_users_alone",
		BaselineMsgsPerSec: round(float64(baseSent)/d.Seconds(), 0), Ratio: round(ratio, 2), RSSMiB: RSSMiB(),
		Goal: "normal users' p99 with attackers <= 2 x without", Pass: ratio <= 2,
		Extra: map[string]any{"ratio_of": "normal users' p99 / baseline p99", "baseline_p50_ms": round(base.Quantile(0.5), 2),
			"baseline_p99_ms": round(baseP99, 2), "normal_samples": att.Len(), "baseline_samples": base.Len(),
			"handled_with_attack": attHandled, "handled_baseline": baseHandled,
			"refused_to_dlq": int64(attSent) - attHandled, "normal_users": normal, "attackers": attackers,
			"handler_work": "2ms", "rate_limit_group": "normal (5 per 10 s, 3 violations block 1 h)"}}, nil
}
