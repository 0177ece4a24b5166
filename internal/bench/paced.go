package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/obs/gather"
)

// The paced scenario: a service desk's traffic, not a pre-filled topic.
// Thousands of customers each write every 15–40 s (~100–500 msg/s in all),
// and the full schedule-consumer posts each message to a receiver with the
// built-in HTTP handler (handler.type: http, the shipped settings). At this
// pace nothing is batched by backlog: every fixed cost a message, an actor
// or a timer pays is seen, which the drained-topic rows hide (a field run
// measured ~1,240 µs a message here against the bench's ~30).
//
// The feeder and the receiver run in a child process (the harness run with
// -scenario paced-peer), so that this process's CPU is the consumer's own;
// the consumer's idle CPU (everything started, no traffic) is measured over
// a quiet period first and subtracted: "net of idle".

// PacedOptions sizes the paced scenario.
type PacedOptions struct {
	Users      int
	Partitions int
	// Duration of the paced traffic (each customer's first message falls
	// in its first MaxGap).
	Duration time.Duration
	// MinGap, MaxGap: a customer's pause between two messages.
	MinGap, MaxGap time.Duration
	// Idle: the quiet period the idle CPU is measured over.
	Idle time.Duration
	// Self is the harness binary, run as the child (os.Args[0]).
	Self string
}

// pacedEvent is a line the child writes on its stdout.
type pacedEvent struct {
	Event      string  `json:"event"`
	Addr       string  `json:"addr,omitempty"`
	Sent       int     `json:"sent,omitempty"`
	Received   int     `json:"received,omitempty"`
	Duplicates int     `json:"duplicates,omitempty"`
	P50Ms      float64 `json:"p50_ms,omitempty"`
	P99Ms      float64 `json:"p99_ms,omitempty"`
	CPUus      int64   `json:"cpu_us,omitempty"`
	Error      string  `json:"error,omitempty"`
}

// Paced runs the scenario: see the comment above.
func Paced(e *Env, o PacedOptions) (Result, error) {
	topic, err := e.Topic("paced", o.Partitions)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Duration+o.Idle+5*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, o.Self, "-scenario", "paced-peer", "-brokers", e.Brokers,
		"-paced-topic", topic, "-users", strconv.Itoa(o.Users), "-duration", o.Duration.String(),
		"-paced-gaps", o.MinGap.String()+","+o.MaxGap.String(), "-paced-idle", o.Idle.String())
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		return Result{}, err
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		return Result{}, err
	}
	if err := child.Start(); err != nil {
		return Result{}, fmt.Errorf("paced: start the feeder: %w", err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	events := bufio.NewScanner(stdout)
	next := func(want string) (pacedEvent, error) {
		for events.Scan() {
			var ev pacedEvent
			if err := json.Unmarshal(events.Bytes(), &ev); err != nil {
				continue // not an event line
			}
			if ev.Error != "" {
				return ev, fmt.Errorf("paced feeder: %s", ev.Error)
			}
			if ev.Event == want {
				return ev, nil
			}
		}
		return pacedEvent{}, fmt.Errorf("paced feeder ended before %q: %v", want, events.Err())
	}
	listen, err := next("listen")
	if err != nil {
		return Result{}, err
	}
	h, err := consumer.NewHandler(config.Handler{Type: "http", HTTP: config.HTTPHandler{URL: "http://" + listen.Addr + "/",
		Timeout: 5 * time.Second, MaxConns: 64}}, e.Log, nil)
	if err != nil {
		return Result{}, err
	}
	s, reg, err := e.startConsumer("paced", topic, h, nil)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = s.Close(context.Background()) }()
	if _, err := io.WriteString(stdin, "start\n"); err != nil {
		return Result{}, err
	}
	// The warm-up messages reached the receiver: every partition is
	// assigned and served. Then the quiet period, then the traffic.
	if _, err := next("warm"); err != nil {
		return Result{}, err
	}
	if _, err := next("idle_start"); err != nil {
		return Result{}, err
	}
	idle0, idleAt := CPUTime(), time.Now()
	if _, err := next("idle_end"); err != nil {
		return Result{}, err
	}
	idleCPU, idleFor := CPUTime()-idle0, time.Since(idleAt)
	if _, err := next("traffic_start"); err != nil {
		return Result{}, err
	}
	cpu0, at0, redisAt0 := CPUTime(), time.Now(), e.RedisCPU()
	done, err := next("done")
	if err != nil {
		return Result{}, err
	}
	cpu, took, redisCPU := CPUTime()-cpu0, time.Since(at0), e.RedisCPU()-redisAt0
	if done.Received < done.Sent {
		return Result{}, fmt.Errorf("paced: %d of %d messages reached the receiver", done.Received, done.Sent)
	}
	idlePerSec := float64(idleCPU) / idleFor.Seconds()
	net := float64(cpu) - idlePerSec*took.Seconds()
	n := float64(done.Sent)
	rate := n / took.Seconds()
	perMsg := round(net/1e3/n, 1)
	actors, _, _ := gather.Sum(reg, "kfpipe_active_processors")
	return Result{Scenario: "consumer_paced", Msgs: done.Sent, MsgsPerSec: round(rate, 0),
		P50Ms: done.P50Ms, P99Ms: done.P99Ms, RSSMiB: RSSMiB(),
		Goal: "cpu_us_per_msg (net of idle, HTTP handler included) <= 80", Pass: perMsg <= 80,
		Extra: map[string]any{"users": o.Users, "partitions": o.Partitions, "gaps": o.MinGap.String() + "–" + o.MaxGap.String(),
			"cpu_us_per_msg":        perMsg,
			"gross_cpu_us_per_msg":  round(float64(cpu)/1e3/n, 1),
			"idle_cpu_ms_per_s":     round(idlePerSec/1e6, 2),
			"redis_cpu_us_per_msg":  round(float64(redisCPU)/1e3/n, 2),
			"feeder_cpu_us_per_msg": round(float64(done.CPUus)/n, 1),
			"receiver_duplicates":   done.Duplicates, "actors_at_end": actors,
			"path": "service.StartConsumer with handler.type http (built-in HTTP handler) to a receiver in a child process; CPU of this process only, the idle rate subtracted"}}, nil
}

// PacedPeer is the child's side: the receiver and the paced feeder. It
// writes its events as JSON lines on out and reads "start" from in.
func PacedPeer(brokers, topic string, users int, duration, minGap, maxGap, idle time.Duration, in io.Reader, out io.Writer) error {
	var mu sync.Mutex
	emit := func(ev pacedEvent) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(ev)
		fmt.Fprintf(out, "%s\n", b)
	}
	fail := func(err error) error { emit(pacedEvent{Event: "error", Error: err.Error()}); return err }

	var (
		recvMu   sync.Mutex
		seen     = map[string]bool{}
		dups     int
		received atomic.Int64
		lat      Latencies
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var m struct {
			ProducedAt int64 `json:"produced_at"`
		}
		_ = json.Unmarshal(body, &m)
		key := r.Header.Get("Idempotency-Key")
		recvMu.Lock()
		if seen[key] {
			dups++
		} else {
			seen[key] = true
			received.Add(1)
			if m.ProducedAt > 0 {
				lat.Add(float64(time.Now().UnixMilli() - m.ProducedAt))
			}
		}
		recvMu.Unlock()
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	emit(pacedEvent{Event: "listen", Addr: ln.Addr().String()})

	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil || line != "start\n" {
		return fail(fmt.Errorf("paced peer: expected start, got %q (%v)", line, err))
	}
	kcfg, err := (&Env{Brokers: brokers}).KafkaConfig(topic, "", "")
	if err != nil {
		return fail(err)
	}
	p, err := NewRawProducer(kcfg)
	if err != nil {
		return fail(err)
	}
	defer p.Close()
	send := func(i int, user string) {
		m := Message("paced", i, user, "hello desk")
		m.ProducedAt = time.Now().UnixMilli()
		_ = p.Produce(Record(topic, m))
	}
	waitReceived := func(n int64, limit time.Duration) bool {
		return waitUntil(limit, func() bool { return received.Load() >= n })
	}
	// Warm-up: 64 customers of their own, which land on every partition of
	// a small topic; when all are received the consumer serves them all.
	const warm = 64
	for i := range warm {
		send(-1-i, fmt.Sprintf("wmWarm%04d", i))
	}
	if !waitReceived(warm, 2*time.Minute) {
		return fail(fmt.Errorf("paced peer: warm-up: %d of %d received", received.Load(), warm))
	}
	emit(pacedEvent{Event: "warm"})
	emit(pacedEvent{Event: "idle_start"})
	time.Sleep(idle)
	emit(pacedEvent{Event: "idle_end"})

	sched := PacedSchedule(rand.New(rand.NewPCG(1, uint64(users))), users, duration, minGap, maxGap)
	cpu0 := CPUTime()
	emit(pacedEvent{Event: "traffic_start"})
	start := time.Now()
	for i, s := range sched {
		if d := time.Until(start.Add(s.At)); d > 0 {
			time.Sleep(d)
		}
		send(i, UserName(s.User))
	}
	total := int64(warm + len(sched))
	if !waitReceived(total, 2*time.Minute) {
		return fail(fmt.Errorf("paced peer: %d of %d received after the traffic", received.Load()-warm, len(sched)))
	}
	recvMu.Lock()
	d := dups
	recvMu.Unlock()
	emit(pacedEvent{Event: "done", Sent: len(sched), Received: int(received.Load() - warm), Duplicates: d,
		P50Ms: round(lat.Quantile(0.5), 1), P99Ms: round(lat.Quantile(0.99), 1), CPUus: (CPUTime() - cpu0).Microseconds()})
	return nil
}

// PacedSend is one message of the paced schedule: when, and whose.
type PacedSend struct {
	At   time.Duration
	User int
}

// PacedSchedule is the desk's traffic: each of users writes first at a
// random point of its first maxGap, then every minGap..maxGap, until
// duration; sorted by time. The same rng state gives the same schedule.
func PacedSchedule(rng *rand.Rand, users int, duration, minGap, maxGap time.Duration) []PacedSend {
	var out []PacedSend
	span := int64(maxGap - minGap)
	for u := range users {
		at := time.Duration(rng.Int64N(int64(maxGap)))
		for at < duration {
			out = append(out, PacedSend{At: at, User: u})
			at += minGap + time.Duration(rng.Int64N(span+1))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}
