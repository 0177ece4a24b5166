package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
// without piling requests on it (peak concurrency within a quarter above
// its capacity; both judged in the full-size run, printed in the reduced
// one), let the lag grow and drain it, and dead-letter nothing:
// lost=0 dup=0 reordered=0 dlq=0. A second effect is allowed only where
// the receiver finished a call after the consumer gave up on it
// (dup_after_timeout, at most 0.1% of the messages).
func TestChaosSlowReceiver(t *testing.T) {
	svc := NeedServices(t)
	const capacity = 32
	feed := Size(20*time.Second, 3*time.Minute)
	// 1–3 s answers: capacity/2 s a second; offered twice that.
	rate := float64(capacity)
	total := int(rate * feed.Seconds())
	users := Size(100, 1000)
	load := Load{Total: total, Users: users, Rate: rate, MaxPerUser: (total + users - 1) / users}
	rcv := newSlowReceiver(capacity, time.Second, 3*time.Second, 0.3)
	var samples []sample
	var stopSampler func() []sample
	var fedAt time.Time
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
		// The receiver's load is the bar (issue 42), judged on the
		// full-size run; the reduced one (20 s of load, in make test, on a machine
		// shared with other suites) measures and prints it: its share
		// ranged 0.48–0.90 and its peak 40–59 over six runs of 40 s, as the
		// limits' climb and sawtooth weigh on 40 s.
		enforce := func(format string, args ...any) {
			if Full() {
				rep.Problem(format, args...)
			} else {
				rep.note(format, args...)
			}
		}
		if bound := capacity + capacity/4; peak > bound {
			enforce("the receiver had %d requests at once, capacity %d (bound %d)", peak, capacity, bound)
		}
		if share < 0.85 {
			enforce("the receiver worked %.2f of its capacity, want >= 0.85", share)
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
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2, Judge: judge})
	p.Sink.SetReceiver(rcv.serve)
	stopSampler = sampler(p, rcv, time.Second)
	Run(t, "slow-receiver", p, load, Size(3*time.Minute, 8*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, feed, feed) {
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
