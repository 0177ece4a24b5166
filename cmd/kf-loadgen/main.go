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
// Users write the way people do: conversations of a few messages (--burst)
// with gaps between them (--gap), pauses between conversations that keep
// the profile's average rate, and send times of now.
//
// It is also the operator's checker of a running deployment
// (docs/operations.md, "Smoke test of a deployment"): --expect FILE writes
// the expected set, the sink writes its record (--record FILE; also as
// `kf-loadgen sink`, a receiver of its own with delay and failure modes),
// and `kf-loadgen check` judges a record against the expected set and the
// DLQ topic with the chaos suite's judge (internal/judge).
//
//	kf-loadgen --config config/development.yaml --profile peak --duration 30s --mode kafka
//	kf-loadgen --config … --profile normal --users 50 --expect exp.jsonl --record rec.jsonl
//	kf-loadgen check --config … --expect exp.jsonl --record rec.jsonl
//	kf-loadgen sink --addr 127.0.0.1:18099 --record rec.jsonl --fail-users u1,u2
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
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
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// profile is a load shape: how many users send how fast, and how their
// conversations look by default.
type profile struct {
	users      int
	perUserMin float64 // messages per user per minute; 0 = as fast as possible
	burst, gap string  // defaults of --burst and --gap
	allowDLQ   string  // default of --allow-dlq: the dead letters the profile is meant to cause
}

var profiles = map[string]profile{
	"normal":     {users: 1000, perUserMin: 2, burst: "1-3", gap: "exp:3s"},
	"peak":       {users: 100, perUserMin: 60, burst: "1-3", gap: "exp:1s"},
	"attack":     {users: 10, perUserMin: 1000, burst: "1", gap: "fixed:0s", allowDLQ: "rate_limited,user_blocked"},
	"throughput": {users: 1000, perUserMin: 0},
}

func main() {
	daemon.Main("kf-loadgen", func(ctx context.Context, args []string) error { return dispatch(ctx, args, os.Stdout, os.Stderr) })
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return runCheck(ctx, args[1:], stdout, stderr)
		case "sink":
			return runSink(ctx, args[1:], stderr)
		}
	}
	return run(ctx, args, stdout, stderr)
}

type options struct {
	cfgPath, profile, mode, sink string
	duration, drain              time.Duration
	users, openKfIDs, maxMsgs    int
	burst, gap, expect, allowDLQ string
	seed                         uint64
	sinkOpts                     sinkFlags
}

// sinkFlags are the sink's delay and failure modes, shared by the run and
// `kf-loadgen sink`.
type sinkFlags struct {
	record, failUsers, failWindows string
	delay, jitter                  time.Duration
}

func (f *sinkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.record, "record", "", "write the sink's record of effects here (JSON lines, what check reads)")
	fs.DurationVar(&f.delay, "sink-delay", 0, "the sink holds each message this long before answering (the handler's work)")
	fs.DurationVar(&f.jitter, "sink-jitter", 0, "plus a random extra of up to this")
	fs.StringVar(&f.failUsers, "fail-users", "", "comma-separated users whose messages the sink answers 500 (switch at runtime: POST /fail?user=U&on=false)")
	fs.StringVar(&f.failWindows, "fail-window", "", "comma-separated LENGTH@START windows (from the sink's start) in which the sink answers 503 to everyone, e.g. 30s@10s (at runtime: POST /fail?all=true&on=true|false)")
}

// open returns the sink's options and a close for the record file.
func (f *sinkFlags) open() (bench.SinkOptions, func() error, error) {
	o := bench.SinkOptions{Delay: f.delay, Jitter: f.jitter}
	if f.delay < 0 || f.jitter < 0 {
		return o, nil, errors.New("--sink-delay and --sink-jitter must be >= 0")
	}
	for _, u := range strings.Split(f.failUsers, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.FailUsers = append(o.FailUsers, u)
		}
	}
	for _, w := range strings.Split(f.failWindows, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		win, err := bench.ParseWindow(w)
		if err != nil {
			return o, nil, fmt.Errorf("--fail-window: %w", err)
		}
		o.FailWindows = append(o.FailWindows, win)
	}
	closeRec := func() error { return nil }
	if f.record != "" {
		rf, err := os.Create(f.record)
		if err != nil {
			return o, nil, fmt.Errorf("--record: %w", err)
		}
		o.Record, closeRec = rf, rf.Close
	}
	return o, closeRec, nil
}

// runSink is `kf-loadgen sink`: the receiver alone, until interrupted.
func runSink(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("kf-loadgen sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:18099", "listen address (the consumer's handler.http.url is http://ADDR/sink)")
	var sf sinkFlags
	sf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	so, closeRec, err := sf.open()
	if err != nil {
		return err
	}
	sink := bench.NewSink(nil, so)
	stop, err := serveSink(*addr, sink)
	if err != nil {
		_ = closeRec()
		return err
	}
	fmt.Fprintf(stderr, "kf-loadgen sink: http://%s/sink (failure switch: POST http://%s/fail?user=U&on=false)\n", *addr, *addr)
	<-ctx.Done()
	stop()
	err = sink.Close()
	if cerr := closeRec(); err == nil {
		err = cerr
	}
	return err
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("kf-loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cfgPath, "config", "", "the daemons' config file (brokers, topics, callback and wecom keys); default $KFPIPE_CONFIG")
	fs.StringVar(&o.profile, "profile", "normal", "normal (1000 users x 2/min) | peak (100 x 60/min) | attack (10 x 1000/min) | throughput (as fast as possible)")
	fs.StringVar(&o.mode, "mode", "kafka", "callback (fake WeChat + signed callbacks to kf-producer) | kafka (produce to the main topic)")
	fs.StringVar(&o.sink, "sink", "127.0.0.1:18099", "address of the sink the consumer's http handler posts to (path /sink); \"none\" when the deployment's own receiver is checked")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to send")
	fs.DurationVar(&o.drain, "drain", 60*time.Second, "how long to wait afterwards for every message to be handled or dead-lettered")
	fs.IntVar(&o.users, "users", 0, "users (0 = the profile's)")
	fs.IntVar(&o.openKfIDs, "open-kfids", 4, "callback mode: customer-service accounts the users are spread over")
	fs.IntVar(&o.maxMsgs, "max-msgs", 2_000_000, "throughput profile: stop after this many messages")
	fs.StringVar(&o.burst, "burst", "", "messages per conversation: N or MIN-MAX (default: the profile's; normal 1-3)")
	fs.StringVar(&o.gap, "gap", "", "gap between a conversation's messages: exp:MEAN | uniform:MIN-MAX | fixed:D (default: the profile's; normal exp:3s)")
	fs.StringVar(&o.expect, "expect", "", "write the expected set here (JSON lines: run, msgid, user, index, at), for check")
	fs.StringVar(&o.allowDLQ, "allow-dlq", "-", "comma-separated dead-letter reasons the run expects (default: the profile's; attack rate_limited,user_blocked); any other makes ok false")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the conversation schedule (0 = from the clock)")
	o.sinkOpts.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: check, sink)", fs.Arg(0))
	}
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
	if o.burst == "" {
		o.burst = p.burst
	}
	if o.gap == "" {
		o.gap = p.gap
	}
	if o.sink == "none" && o.expect == "" {
		return errors.New("--sink none needs --expect FILE: the run is judged later by check, on the receiver's record")
	}
	if o.allowDLQ == "-" {
		o.allowDLQ = p.allowDLQ
	}
	var sched *conversations
	if p.perUserMin > 0 {
		burst, err := parseBurst(o.burst)
		if err != nil {
			return err
		}
		gap, err := parseGap(o.gap)
		if err != nil {
			return err
		}
		if o.seed == 0 {
			o.seed = uint64(time.Now().UnixNano())
		}
		sched = newConversations(p.users, p.perUserMin, burst, gap, time.Now(), o.duration, o.seed)
	}
	path := config.Path(o.cfgPath)
	ccfg, err := config.LoadConsumer(path)
	if err != nil {
		return err
	}
	// The run judges itself the way check does, on the sink's record: in
	// a temporary file when no --record is asked for (a file, not memory:
	// a throughput run records millions).
	if o.sinkOpts.record == "" && o.sink != "none" {
		tmp, err := os.CreateTemp("", "kf-loadgen-record-*.jsonl")
		if err != nil {
			return fmt.Errorf("record: %w", err)
		}
		_ = tmp.Close()
		defer os.Remove(tmp.Name())
		o.sinkOpts.record = tmp.Name()
	}
	so, closeRec, err := o.sinkOpts.open()
	if err != nil {
		return err
	}
	defer func() { _ = closeRec() }()
	exp := (*expectWriter)(nil)
	if o.expect != "" {
		if exp, err = createExpect(o.expect); err != nil {
			return err
		}
		defer func() { _ = exp.close() }()
	}

	ledger := bench.NewLedger()
	sink := bench.NewSink(ledger, so)
	if o.sink != "none" {
		stopSink, err := serveSink(o.sink, sink)
		if err != nil {
			return err
		}
		defer stopSink()
	}
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
	fmt.Fprintf(stderr, "kf-loadgen: profile %s, %d users, mode %s, %s, burst %s gap %s, sink http://%s/sink, run %s\n",
		o.profile, p.users, o.mode, o.duration, o.burst, o.gap, o.sink, run)
	var expected []expectLine
	record := func(l expectLine) {
		l.Run = run
		expected = append(expected, l)
		exp.add(l)
	}
	start := time.Now()
	sent, err := generate(ctx, p, o, sched, run, ledger, send, record)
	sendTime := time.Since(start)
	if err != nil {
		return err
	}
	if err := exp.close(); err != nil {
		return err
	}
	exp = nil
	if o.sink == "none" {
		b, _ := json.Marshal(map[string]any{"profile": o.profile, "mode": o.mode, "users": p.users, "sent": sent,
			"run": run, "expect": o.expect, "send_seconds": sendTime.Seconds()})
		fmt.Fprintln(stdout, string(b))
		fmt.Fprintf(stderr, "sent %d in %s; judge it with: kf-loadgen check --expect %s --record RECEIVER_RECORD\n",
			sent, sendTime.Round(time.Millisecond), o.expect)
		return nil
	}
	deadline := time.Now().Add(o.drain)
	for ledger.Accounted() < sent && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	total := time.Since(start)
	if err := sink.Close(); err != nil {
		return fmt.Errorf("--record: %w", err)
	}
	rep := ledger.Verify()
	dead := map[string][]string{}
	for id, r := range ledger.DeadLetters() {
		dead[id] = []string{r}
	}
	effects, err := readRecord(o.sinkOpts.record)
	if err != nil {
		return err
	}
	chk := judgeRuns(expected, effects, dead, checkRules{allow: reasonSet(o.allowDLQ)})
	out := map[string]any{"profile": o.profile, "mode": o.mode, "users": p.users, "sent": sent, "run": run,
		"send_seconds": sendTime.Seconds(), "send_msgs_per_sec": float64(sent) / sendTime.Seconds(),
		"end_to_end_msgs_per_sec": float64(rep.Handled) / total.Seconds(), "report": rep, "check": chk.Runs, "ok": chk.OK}
	b, _ := json.Marshal(out)
	fmt.Fprintln(stdout, string(b))
	fmt.Fprintf(stderr, "sent %d in %s; handled %d, dead-lettered %v; latency p50 %.1f ms p99 %.1f ms\n",
		sent, sendTime.Round(time.Millisecond), rep.Handled, rep.DeadLettered, rep.P50Ms, rep.P99Ms)
	for _, rv := range chk.Runs {
		fmt.Fprintln(stderr, rv.line())
		for _, e := range rv.Examples {
			fmt.Fprintln(stderr, "  "+e)
		}
	}
	if !chk.OK {
		return errors.New("verification failed (details above)")
	}
	return nil
}

// sender sends one tick's messages; each is (user, seq).
type sender interface {
	send(ctx context.Context, run string, batch []item, ledger *bench.Ledger, record func(expectLine)) error
}

type item struct {
	user string
	seq  int
}

// generate sends the profile's messages every 10 ms until the duration is
// over (or, for throughput, as fast as the sender takes them, round robin
// over the users).
func generate(ctx context.Context, p profile, o options, sched *conversations, run string, ledger *bench.Ledger, s sender, record func(expectLine)) (int, error) {
	seqs := make([]int, p.users)
	one := func(u int) item {
		it := item{user: fmt.Sprintf("wm%s%06d", o.profile, u), seq: seqs[u]}
		seqs[u]++
		return it
	}
	sent := 0
	start := time.Now()
	if sched == nil {
		next := 0
		for time.Since(start) < o.duration && sent < o.maxMsgs && ctx.Err() == nil {
			b := make([]item, 1000)
			for i := range b {
				b[i] = one(next % p.users)
				next++
			}
			if err := s.send(ctx, run, b, ledger, record); err != nil {
				return sent, err
			}
			sent += len(b)
		}
		return sent, nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil {
		var now time.Time
		select {
		case now = <-t.C:
		case <-ctx.Done():
			return sent, nil
		}
		if now.Sub(start) >= o.duration {
			break
		}
		var b []item
		sched.due(now, func(u int, _ time.Time) { b = append(b, one(u)) })
		if len(b) == 0 {
			continue
		}
		if err := s.send(ctx, run, b, ledger, record); err != nil {
			return sent, err
		}
		sent += len(b)
	}
	return sent, nil
}

type kafkaSender struct {
	kp     *producer.KafkaProducer
	topic  string
	nextID int64
}

func (k *kafkaSender) send(ctx context.Context, run string, batch []item, ledger *bench.Ledger, record func(expectLine)) error {
	msgs := make([]*chatmsg.ChatMessage, len(batch))
	now := time.Now()
	if k.nextID == 0 {
		k.nextID = int64(1e15) + now.UnixNano()%int64(1e14)
	}
	for i, it := range batch {
		msgs[i] = kafkaMessage(run, it, now, k.nextID)
		k.nextID++
		ledger.Sent(msgs[i].UpstreamMsgID, it.user, it.seq)
	}
	// One batch at a time keeps each user's messages in order (a user's
	// later batch is produced after the earlier one is acknowledged).
	if err := k.kp.ProduceBatch(ctx, k.topic, msgs); err != nil {
		return err
	}
	for i, it := range batch {
		record(expectLine{MsgID: msgs[i].UpstreamMsgID, User: it.user, Index: it.seq, At: now})
	}
	return nil
}

// kafkaMessage is the ChatMessage kf-producer would make of it, sent now:
// send_time is the current second (the limiter's windows run on it).
func kafkaMessage(run string, it item, now time.Time, id int64) *chatmsg.ChatMessage {
	msgid := run + "-" + it.user + "-" + strconv.Itoa(it.seq)
	raw, _ := json.Marshal(map[string]any{"msgid": msgid, "send_time": now.Unix(), "origin": 3, "msgtype": "text",
		"text": map[string]string{"content": "seq " + strconv.Itoa(it.seq)}})
	return &chatmsg.ChatMessage{MessageID: id, UpstreamMsgID: msgid, OpenKfID: "wkLoadgen",
		ExternalUserID: it.user, MsgType: "text", Origin: 3, SendTime: now.Unix(), Content: raw}
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

func (s *callbackSender) send(ctx context.Context, _ string, batch []item, ledger *bench.Ledger, record func(expectLine)) error {
	touched := map[string]bool{}
	for _, it := range batch {
		kf := s.kfs[int(hash(it.user))%len(s.kfs)]
		// The fake stamps send_time now.
		id := s.fake.AddText(kf, it.user, "seq "+strconv.Itoa(it.seq))
		ledger.Sent(id, it.user, it.seq)
		record(expectLine{MsgID: id, User: it.user, Index: it.seq, At: time.Now()})
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

func serveSink(addr string, s *bench.Sink) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
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
