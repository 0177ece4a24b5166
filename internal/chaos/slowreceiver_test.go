package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/overload"
)

// slowReceiver is a business receiver slower than the offered load: it
// works on capacity requests at a time, each for a latency drawn from
// [lo, hi], and queues the rest (a web server's worker pool); a request
// whose client gave up is still worked on (its effect happens, late). It
// does not dedup. firstFail of the first attempts of a message get a fast
// 503.
type slowReceiver struct {
	capacity  int
	slots     chan struct{}
	lo, hi    atomic.Int64 // nanoseconds
	firstFail float64

	mu      sync.Mutex
	tried   map[string]bool
	open    int // requests at the receiver: queued or worked on
	peak    int
	fast503 int
	work    time.Duration // the latencies of the requests worked on
	first   time.Time     // the first request worked on
	last    time.Time     // the last one finished
}

func newSlowReceiver(capacity int, lo, hi time.Duration, firstFail float64) *slowReceiver {
	r := &slowReceiver{capacity: capacity, slots: make(chan struct{}, capacity), firstFail: firstFail, tried: map[string]bool{}}
	r.setLatency(lo, hi)
	return r
}

func (r *slowReceiver) setLatency(lo, hi time.Duration) {
	r.lo.Store(int64(lo))
	r.hi.Store(int64(hi))
}

func (r *slowReceiver) serve(_ *http.Request, msgID string) int {
	r.mu.Lock()
	first := !r.tried[msgID]
	r.tried[msgID] = true
	if first && rand.Float64() < r.firstFail {
		r.fast503++
		r.mu.Unlock()
		return http.StatusServiceUnavailable
	}
	r.open++
	r.peak = max(r.peak, r.open)
	r.mu.Unlock()
	r.slots <- struct{}{}
	lo, hi := time.Duration(r.lo.Load()), time.Duration(r.hi.Load())
	d := lo
	if hi > lo {
		d += rand.N(hi - lo)
	}
	began := time.Now()
	time.Sleep(d)
	<-r.slots
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open--
	r.work += d
	if r.first.IsZero() || began.Before(r.first) {
		r.first = began
	}
	r.last = time.Now()
	return 0
}

// utilisation is the share of the receiver's capacity it worked, from
// its first request to its last answer.
func (r *slowReceiver) utilisation() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	span := r.last.Sub(r.first)
	if span <= 0 {
		return 0
	}
	return r.work.Seconds() / (span.Seconds() * float64(r.capacity))
}

// sample is one reading of the consumers' overload metrics.
type sample struct {
	at                  time.Duration
	limit, inFlight     float64
	waiting, lag        float64
	latency, receiverAt float64
	receiverOpen        int
}

// sampler reads the consumers' limit, in-flight calls, latency and lag
// every period until stop.
func sampler(p *Pipeline, r *slowReceiver, period time.Duration) (stop func() []sample) {
	ctx, cancel := context.WithCancel(context.Background())
	var out []sample
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s := sample{at: time.Since(start)}
			n := 0.0
			for _, c := range p.Consumers {
				if !c.Running() {
					continue
				}
				rctx, rc := context.WithTimeout(ctx, time.Second)
				l, err1 := c.MetricSum(rctx, "kfpipe_handler_limit")
				f, err2 := c.MetricSum(rctx, "kfpipe_handler_in_flight")
				w, _ := c.MetricSum(rctx, "kfpipe_handler_waiting")
				lat, _ := c.MetricSum(rctx, "kfpipe_handler_latency_seconds")
				lag, _ := c.MetricSum(rctx, "kfpipe_consumer_lag")
				rc()
				if err1 != nil || err2 != nil {
					continue
				}
				s.limit += l
				s.inFlight += f
				s.waiting += w
				if lat > 0 {
					s.latency += lat
					n++
				}
				s.lag += lag
			}
			if n > 0 {
				s.latency /= n
			}
			s.receiverAt = float64(r.hi.Load()+r.lo.Load()) / 2 / float64(time.Second)
			r.mu.Lock()
			s.receiverOpen = r.open
			r.mu.Unlock()
			out = append(out, s)
		}
	}()
	return func() []sample {
		cancel()
		<-done
		return out
	}
}

// TestChaosSlowReceiver is the slow-receiver journey (issue 42): the
// consumers, with the shipped settings and the built-in http handler,
// call a receiver that can carry capacity requests at a time, each
// answered in 1–3 s, offered twice what it can carry, 30% of first
// attempts answered with a fast 503. The receiver does not dedup. The
// consumers must keep it busy (its throughput ≥ 85% of its capacity)
// without piling requests on it (peak concurrency within
// overload.PeakBound: its capacity, the queue the limiters cannot tell
// from the spread of its answers, one call a consumer), let the lag grow
// and drain it, and dead-letter nothing: lost=0 dup=0 reordered=0 dlq=0.
// A second effect is allowed only where the receiver finished a call
// after the consumer gave up on it (late_effects, at most 0.1% of the
// messages).
func TestChaosSlowReceiver(t *testing.T) {
	runSlowReceiver(t, "slow-receiver", false)
}

// TestChaosSlowReceiverRollingRestart is the same journey with a rolling
// restart in the middle of the load: each consumer in turn is stopped
// with SIGTERM while its calls to the slow receiver run and started
// again. It must stay clean (lost=0 dup=0 reordered=0 dlq=0, late
// effects within 0.1%) and keep the receiver's peak within the bound; a
// restarted consumer's limit starts again from overload.initial_limit,
// so the share is printed, not judged.
//
// Every setting is the shipped one: ops.shutdown_timeout's 25 s default
// leaves a stop revoke_drain_limit (10 s) to await the calls running at
// the receiver (3 s at most) before it cancels them. With the old 8 s
// default a stop gave them 1 s: a reduced run cancelled 11 calls the
// receiver, which does not notice a client leaving, finished anyway, and
// the next owner called again (late_effects=11 of 640).
func TestChaosSlowReceiverRollingRestart(t *testing.T) {
	runSlowReceiver(t, "slow-receiver-rolling-restart", true)
}

// shippedTolerance is overload.tolerance's shipped default (the
// config's struct tag), which the peak bound depends on.
func shippedTolerance(t *testing.T) float64 {
	f, ok := reflect.TypeOf(config.Overload{}).FieldByName("Tolerance")
	if !ok {
		t.Fatal("config.Overload has no Tolerance")
	}
	v, err := strconv.ParseFloat(f.Tag.Get("default"), 64)
	if err != nil {
		t.Fatalf("overload.tolerance default: %v", err)
	}
	return v
}

func runSlowReceiver(t *testing.T, name string, rolling bool) {
	svc := NeedServices(t)
	const capacity, consumers = 32, 2
	feed := Size(20*time.Second, 3*time.Minute)
	if rolling {
		// The reduced run in make test stays near a minute with its two
		// stops and starts.
		feed = Size(15*time.Second, 3*time.Minute)
	}
	// 1–3 s answers: capacity/2 s a second; offered twice that.
	rate := float64(capacity)
	total := int(rate * feed.Seconds())
	users := Size(100, 1000)
	load := Load{Total: total, Users: users, Rate: rate, MaxPerUser: (total + users - 1) / users}
	rcv := newSlowReceiver(capacity, time.Second, 3*time.Second, 0.3)
	bound := overload.PeakBound(capacity, shippedTolerance(t), consumers)
	var samples []sample
	var stopSampler func() []sample
	var fedAt time.Time
	var p *Pipeline
	judge := func(ev *Evidence, rep *Report) {
		samples = stopSampler()
		if rep.DLQ > 0 {
			rep.Problem("%d dead letters for a receiver that was only slow", rep.DLQ)
		}
		rcv.mu.Lock()
		peak, fast := rcv.peak, rcv.fast503
		rcv.mu.Unlock()
		share := rcv.utilisation()
		rep.Extra("capacity", capacity)
		rep.Extra("receiver_peak_concurrency", peak)
		rep.Extra("peak_bound", bound)
		rep.Extra("throughput_share", fmt.Sprintf("%.2f", share))
		rep.Extra("fast_503", fast)
		maxLag, maxLimit := 0.0, 0.0
		for _, s := range samples {
			maxLag, maxLimit = max(maxLag, s.lag), max(maxLimit, s.limit)
		}
		rep.Extra("max_lag", int(maxLag))
		rep.Extra("max_limit", int(maxLimit))
		var lastEffect time.Time
		for _, d := range ev.Deliveries {
			if d.At.After(lastEffect) {
				lastEffect = d.At
			}
		}
		rep.Extra("drain", lastEffect.Sub(fedAt).Round(100*time.Millisecond))
		if peak > bound {
			rep.Problem("the receiver had %d requests at once, capacity %d (bound %d)", peak, capacity, bound)
		}
		// The share is the bar (≥ 0.85) on the full-size run. The
		// reduced one (20 s of load, in make test) spends a third of its
		// ~40 s of work with the limits climbing from
		// 2 × overload.initial_limit to the capacity and draining the last
		// users' messages one at a time; it is held to a looser 0.6. A
		// rolling restart starts each restarted consumer's limit again from
		// overload.initial_limit: printed, not judged.
		switch want := Size(0.6, 0.85); {
		case rolling:
		case share < want:
			rep.Problem("the receiver worked %.2f of its capacity, want >= %.2f", share, want)
		}
		if rolling {
			var awaited, cancelled, lapsed int
			for _, d := range p.Consumers {
				a, c, l := handOvers(d)
				awaited, cancelled, lapsed = awaited+a, cancelled+c, lapsed+l
			}
			rep.Extra("handlers_awaited", awaited)
			rep.Extra("handlers_cancelled", cancelled)
			rep.Extra("handlers_left_to_lapse", lapsed)
		}
		late := 0
		for _, d := range ev.Deliveries {
			if d.Late {
				late++
			}
		}
		rep.Extra("late_effects", late)
		if 1000*late > len(ev.Sent) {
			rep.Problem("%d effects made after the consumer gave up on them, more than 0.1%% of %d", late, len(ev.Sent))
		}
	}
	opts := Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: consumers, Judge: judge}
	p = Start(t, opts)
	p.Sink.SetReceiver(rcv.serve)
	stopSampler = sampler(p, rcv, time.Second)
	Run(t, name, p, load, Size(3*time.Minute, 8*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		began := time.Now()
		if rolling {
			// A third into the load, each consumer in turn: SIGTERM while
			// its calls run, then start it again.
			if !Pause(ctx, feed/3, feed/3) {
				return ctx.Err()
			}
			for _, d := range p.Consumers {
				if err := d.Stop(time.Minute); err != nil {
					rec.Problem("SIGTERM %s: %v", d.Name, err)
				}
				if err := d.Restart(time.Minute); err != nil {
					return err
				}
				if !Pause(ctx, 2*time.Second, 2*time.Second) {
					return ctx.Err()
				}
			}
			rec.Extra("restarted", len(p.Consumers))
		}
		if rest := feed - time.Since(began); rest > 0 && !Pause(ctx, rest, rest) {
			return ctx.Err()
		}
		fedAt = time.Now()
		return nil
	})
	t.Log("\n" + sampleTable(samples, 5*time.Second))
}

// TestChaosReceiverSlowsDown: a receiver of capacity 8 answering in
// 100 ms slows to 3 s and comes back, under a steady load that the fast
// receiver carries and the slow one does not. The consumers' limit
// follows it (the table of limit, in-flight calls and latency over time
// is printed; docs/operations.md shows one), and nothing is lost,
// repeated or dead-lettered.
func TestChaosReceiverSlowsDown(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	const capacity = 8
	phase := Size(20*time.Second, time.Minute)
	rate := 20.0
	total := int(rate * 3 * phase.Seconds())
	load := Load{Total: total, Users: 100, Rate: rate, MaxPerUser: total/100 + 1}
	rcv := newSlowReceiver(capacity, 100*time.Millisecond, 100*time.Millisecond, 0)
	var stopSampler func() []sample
	var samples []sample
	judge := func(ev *Evidence, rep *Report) {
		samples = stopSampler()
		if rep.DLQ > 0 {
			rep.Problem("%d dead letters for a receiver that was only slow", rep.DLQ)
		}
		rcv.mu.Lock()
		rep.Extra("receiver_peak_concurrency", rcv.peak)
		rcv.mu.Unlock()
	}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1, Judge: judge})
	p.Sink.SetReceiver(rcv.serve)
	stopSampler = sampler(p, rcv, time.Second)
	Run(t, "receiver-slows-down", p, load, Size(3*time.Minute, 6*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, phase, phase) {
			return ctx.Err()
		}
		rcv.setLatency(3*time.Second, 3*time.Second)
		if !Pause(ctx, phase, phase) {
			return ctx.Err()
		}
		rcv.setLatency(100*time.Millisecond, 100*time.Millisecond)
		return nil
	})
	t.Log("\n" + sampleTable(samples, 2*time.Second))
}

// sampleTable prints samples every step as a markdown table.
func sampleTable(samples []sample, step time.Duration) string {
	sort.Slice(samples, func(i, j int) bool { return samples[i].at < samples[j].at })
	var b strings.Builder
	b.WriteString("| t (s) | receiver latency (s) | limit | in flight | waiting | at receiver | latency (s) | lag |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	next := time.Duration(0)
	for _, s := range samples {
		if s.at < next {
			continue
		}
		next = s.at.Truncate(step) + step
		fmt.Fprintf(&b, "| %.0f | %.1f | %.0f | %.0f | %.0f | %d | %.2f | %.0f |\n", s.at.Seconds(), s.receiverAt,
			s.limit, s.inFlight, s.waiting, s.receiverOpen, s.latency, s.lag)
	}
	return b.String()
}
