// Command kf-loadgen drives the running pipeline with a load profile
// (normal, peak, attack, throughput) and checks, at the end, that nothing was lost, no
// message had two effects and every user's messages were handled in order.
//
// It sends either the way WeChat does (--mode callback: it hosts the fake
// WeChat API at wecom.base_url, appends the messages there and posts signed
// kf_msg_or_event callbacks to kf-producer's callback endpoint) or straight
// into Kafka (--mode kafka: ChatMessages produced to the main topic through
// the producer's own KafkaProducer). It hosts the sink that the
// schedule-consumer's http handler posts to (handler.type=http,
// handler.http.url=http://<--sink>/sink) and reads the DLQ topic, so a
// message refused by the rate limiter counts as dead-lettered, not lost.
//
//	kf-loadgen --config config/development.yaml --profile peak --duration 30s --mode kafka
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/bench"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/version"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// profile is a load shape: how many users send how fast.
type profile struct {
	users      int
	perUserMin float64 // messages per user per minute; 0 = as fast as possible
}

var profiles = map[string]profile{
	"normal":     {users: 1000, perUserMin: 2},
	"peak":       {users: 100, perUserMin: 60},
	"attack":     {users: 10, perUserMin: 1000},
	"throughput": {users: 1000, perUserMin: 0},
}

func main() {
	if version.Handle(os.Stdout, "kf-loadgen", os.Args[1:], daemon.Librdkafka) {
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kf-loadgen:", err)
		os.Exit(1)
	}
}

type options struct {
	cfgPath, profile, mode, sink string
	duration, drain              time.Duration
	users, openKfIDs, maxMsgs    int
}

func run() error {
	var o options
	flag.StringVar(&o.cfgPath, "config", "", "the daemons' config file (brokers, topics, callback and wecom keys); default $KFPIPE_CONFIG")
	flag.StringVar(&o.profile, "profile", "normal", "normal (1000 users x 2/min) | peak (100 x 60/min) | attack (10 x 1000/min) | throughput (as fast as possible)")
	flag.StringVar(&o.mode, "mode", "kafka", "callback (fake WeChat + signed callbacks to kf-producer) | kafka (produce to the main topic)")
	flag.StringVar(&o.sink, "sink", "127.0.0.1:18099", "address of the sink the consumer's http handler posts to (path /sink)")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "how long to send")
	flag.DurationVar(&o.drain, "drain", 60*time.Second, "how long to wait afterwards for every message to be handled or dead-lettered")
	flag.IntVar(&o.users, "users", 0, "users (0 = the profile's)")
	flag.IntVar(&o.openKfIDs, "open-kfids", 4, "callback mode: customer-service accounts the users are spread over")
	flag.IntVar(&o.maxMsgs, "max-msgs", 2_000_000, "throughput profile: stop after this many messages")
	flag.Parse()
	p, ok := profiles[o.profile]
	if !ok {
		return fmt.Errorf("--profile must be normal, peak, attack or throughput, got %q", o.profile)
	}
	if o.users > 0 {
		p.users = o.users
	}
	if o.mode != "kafka" && o.mode != "callback" {
		return fmt.Errorf("--mode must be callback or kafka, got %q", o.mode)
	}
	path := config.Path(o.cfgPath)
	ccfg, err := config.LoadConsumer(path)
	if err != nil {
		return err
	}
	ctx, cancel := daemon.SignalContext()
	defer cancel()

	ledger := bench.NewLedger()
	stopSink, err := serveSink(o.sink, ledger)
	if err != nil {
		return err
	}
	defer stopSink()
	stopDLQ := readDLQ(ccfg.Kafka, ledger)
	defer stopDLQ()

	var send sender
	switch o.mode {
	case "kafka":
		kp, err := producer.NewKafkaProducer(ccfg.Kafka, nil, zap.NewNop())
		if err != nil {
			return err
		}
		defer func() { _ = kp.Close(context.Background()) }()
		send = &kafkaSender{kp: kp, topic: ccfg.Kafka.Topics.Main.Name}
	case "callback":
		pcfg, err := config.LoadProducer(path)
		if err != nil {
			return err
		}
		cs, stop, err := newCallbackSender(pcfg, o.openKfIDs)
		if err != nil {
			return err
		}
		defer stop()
		send = cs
	}

	run := fmt.Sprintf("lg%d", time.Now().UnixNano()%1e10)
	fmt.Fprintf(os.Stderr, "kf-loadgen: profile %s, %d users, mode %s, %s, sink http://%s/sink, run %s\n",
		o.profile, p.users, o.mode, o.duration, o.sink, run)
	start := time.Now()
	sent, err := generate(ctx, p, o, run, ledger, send)
	sendTime := time.Since(start)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(o.drain)
	for ledger.Accounted() < sent && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	total := time.Since(start)
	rep := ledger.Verify()
	out := map[string]any{"profile": o.profile, "mode": o.mode, "users": p.users, "sent": sent,
		"send_seconds": sendTime.Seconds(), "send_msgs_per_sec": float64(sent) / sendTime.Seconds(),
		"end_to_end_msgs_per_sec": float64(rep.Handled) / total.Seconds(), "report": rep, "ok": rep.OK()}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	fmt.Fprintf(os.Stderr, "sent %d in %s; handled %d, dead-lettered %v, lost %d, duplicate effects %d, users out of order %d; latency p50 %.1f ms p99 %.1f ms\n",
		sent, sendTime.Round(time.Millisecond), rep.Handled, rep.DeadLettered, rep.Lost, rep.Duplicates, rep.OutOfOrder, rep.P50Ms, rep.P99Ms)
	if !rep.OK() {
		return fmt.Errorf("verification failed: %v", rep.Examples)
	}
	return nil
}

// sender sends one tick's messages; each is (user, seq).
type sender interface {
	send(ctx context.Context, run string, batch []item, ledger *bench.Ledger) error
}

type item struct {
	user string
	seq  int
}

// generate sends the profile's messages every 10 ms until the duration is
// over (or, for throughput, as fast as the sender takes them).
func generate(ctx context.Context, p profile, o options, run string, ledger *bench.Ledger, s sender) (int, error) {
	seqs := make([]int, p.users)
	next := 0 // round-robin over users
	take := func(n int) []item {
		batch := make([]item, n)
		for i := range batch {
			u := next % p.users
			next++
			batch[i] = item{user: fmt.Sprintf("wm%s%06d", o.profile, u), seq: seqs[u]}
			seqs[u]++
		}
		return batch
	}
	sent := 0
	start := time.Now()
	if p.perUserMin == 0 {
		for time.Since(start) < o.duration && sent < o.maxMsgs && ctx.Err() == nil {
			b := take(1000)
			if err := s.send(ctx, run, b, ledger); err != nil {
				return sent, err
			}
			sent += len(b)
		}
		return sent, nil
	}
	rate := float64(p.users) * p.perUserMin / 60
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil {
		now := <-t.C
		el := now.Sub(start)
		if el >= o.duration {
			break
		}
		if due := int(rate * el.Seconds()); due > sent {
			b := take(due - sent)
			if err := s.send(ctx, run, b, ledger); err != nil {
				return sent, err
			}
			sent += len(b)
		}
	}
	return sent, nil
}

type kafkaSender struct {
	kp    *producer.KafkaProducer
	topic string
}

func (k *kafkaSender) send(ctx context.Context, run string, batch []item, ledger *bench.Ledger) error {
	msgs := make([]*chatmsg.ChatMessage, len(batch))
	for i, it := range batch {
		m := bench.Message(run+"-"+it.user, it.seq, it.user, "seq "+strconv.Itoa(it.seq))
		ledger.Sent(m.UpstreamMsgID, it.user, it.seq)
		msgs[i] = m
	}
	// One batch at a time keeps each user's messages in order (a user's
	// later batch is produced after the earlier one is acknowledged).
	return k.kp.ProduceBatch(ctx, k.topic, msgs)
}

type callbackSender struct {
	fake *wecomtest.Server
	kfs  []string
}

func newCallbackSender(c *config.Producer, n int) (*callbackSender, func(), error) {
	u, err := url.Parse(c.WeCom.BaseURL)
	if err != nil || u.Host == "" {
		return nil, nil, fmt.Errorf("wecom.base_url %q: the fake WeChat is served there", c.WeCom.BaseURL)
	}
	host, port, _ := net.SplitHostPort(c.Callback.Addr)
	if host == "" || host == "0.0.0.0" {
		host = "127.0.0.1"
	}
	cb := &wecomtest.CallbackSender{URL: "http://" + net.JoinHostPort(host, port) + c.Callback.Path,
		Token: c.Callback.Token, AESKey: c.Callback.EncodingAESKey, CorpID: c.WeCom.CorpID}
	fake := wecomtest.NewHandler(wecomtest.Options{CorpID: c.WeCom.CorpID, Secret: c.WeCom.Secret, Callback: cb})
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		return nil, nil, fmt.Errorf("fake WeChat at wecom.base_url: %w", err)
	}
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s := &callbackSender{fake: fake}
	for i := range n {
		s.kfs = append(s.kfs, fmt.Sprintf("wkLoadgen%02d", i))
	}
	return s, func() { _ = srv.Close() }, nil
}

func (s *callbackSender) send(ctx context.Context, _ string, batch []item, ledger *bench.Ledger) error {
	touched := map[string]bool{}
	for _, it := range batch {
		kf := s.kfs[int(hash(it.user))%len(s.kfs)]
		id := s.fake.AddText(kf, it.user, "seq "+strconv.Itoa(it.seq))
		ledger.Sent(id, it.user, it.seq)
		touched[kf] = true
	}
	// One callback per account per tick, as WeChat coalesces nothing but
	// kf-producer would: each callback triggers a sync of the account.
	for kf := range touched {
		if _, err := s.fake.Notify(ctx, kf); err != nil {
			return fmt.Errorf("callback: %w", err)
		}
	}
	return nil
}

func hash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

func serveSink(addr string, l *bench.Ledger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/sink", l.SinkHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// readDLQ reads the DLQ topic from its start in a fresh group, recording
// dead letters in the ledger, until the returned stop is called.
func readDLQ(k config.Kafka, l *bench.Ledger) func() {
	cm := kafkaclient.Consumer(k, fmt.Sprintf("kf-loadgen-%d", time.Now().UnixNano()))
	_ = cm.SetKey("auto.offset.reset", "earliest")
	c, err := kafka.NewConsumer(cm)
	if err == nil {
		err = c.Subscribe(k.Topics.DLQ.Name, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kf-loadgen: DLQ not readable (refused messages will count as lost):", err)
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := c.ReadMessage(100 * time.Millisecond)
			var ke kafka.Error
			if err != nil && !(errors.As(err, &ke) && ke.IsTimeout()) {
				continue
			}
			if m != nil {
				_ = l.AddDeadLetter(m.Value)
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}
