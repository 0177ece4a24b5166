package consumer

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/overload"
)

// downstream is the consumer's overload control at the handler boundary
// (docs/architecture.md, "Overload"): an adaptive limit on the handler
// calls in flight, so that a message waits in its actor (and the
// partition's lag grows) instead of queueing at a slow receiver behind a
// timeout, and a retry budget, so that failures do not multiply the
// calls. Both are nil-safe; a fast handler pays a mutex and a clock read
// per call, nothing that allocates or starts a goroutine.
type downstream struct {
	limit  *overload.Limiter
	budget *overload.Budget

	mu sync.Mutex
	// timeouts are the last two users whose calls timed out, the latest
	// first, with when: slowness is the downstream's only when another
	// user's calls time out too (a single customer's hanging calls are
	// that customer's, dead-lettered after their attempts).
	timeouts [2]userTimeout
	// memDone is closed when remember ended (nil: not started).
	memDone chan struct{}
}

type userTimeout struct {
	user string
	at   time.Time
}

// limitSaveEvery is how often a consumer saves its handler limit in the
// group's LimitMemory (once it moved), limitKeep how long a saved one
// is kept: a limit saved longer ago says little of the downstream now.
const (
	limitSaveEvery = 10 * time.Second
	limitKeep      = 10 * time.Minute
)

// recall raises the limit to the one the group last saved (mem nil: no
// memory) and starts saving it every limitSaveEvery until stopRemembering.
// It waits at most 2 s for the memory: a start is not held up by it.
func (d *downstream) recall(ctx context.Context, mem LimitMemory, name string, log *zap.Logger) {
	if d == nil || d.limit == nil || mem == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	n, err := mem.LoadLimit(lctx, name)
	cancel()
	switch {
	case err != nil:
		log.Warn("handler limit: the group's saved limit could not be read; starting at overload.initial_limit", zap.Error(err))
	case n > d.limit.Stats().Limit:
		d.limit.Raise(n)
		log.Info("handler limit: starting at the limit the group saved", zap.Int("limit", d.limit.Stats().Limit))
	}
	d.memDone = make(chan struct{})
	go d.remember(ctx, mem, name, log)
}

// remember saves the limit every limitSaveEvery, once it moved from where
// it started (a member that never used its limit says nothing of the
// downstream), until ctx ends.
func (d *downstream) remember(ctx context.Context, mem LimitMemory, name string, log *zap.Logger) {
	defer close(d.memDone)
	t := time.NewTicker(limitSaveEvery)
	defer t.Stop()
	start, moved := d.limit.Stats().Limit, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := d.limit.Stats().Limit
		if moved = moved || n != start; !moved {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := mem.SaveLimit(sctx, name, n, limitKeep); err != nil && ctx.Err() == nil {
			log.Debug("handler limit: not saved", zap.Error(err))
		}
		cancel()
	}
}

// stopRemembering waits for remember to end (its context ended first).
func (d *downstream) stopRemembering() {
	if d != nil && d.memDone != nil {
		<-d.memDone
	}
}

// retryBurst is how many retries the budget saves up.
const retryBurst = 20

func newDownstream(cfg config.Consumer, now func() time.Time, reg prometheus.Registerer) *downstream {
	o := cfg.Overload
	ceiling := o.MaxInFlight
	if cfg.Handler.Type == "http" && cfg.Handler.HTTP.MaxConns > 0 {
		// Never more calls than connections: a call beyond them would
		// wait for one inside its timeout.
		ceiling = min(ceiling, cfg.Handler.HTTP.MaxConns)
	}
	d := &downstream{budget: overload.NewBudget(o.RetryBudget, o.RetryFloor, retryBurst, now)}
	if o.MaxInFlight > 0 { // 0: no limit (a nil Limiter admits every call)
		lc := overload.Config{Initial: min(o.InitialLimit, ceiling), Min: 1, Max: ceiling, Tolerance: o.Tolerance, Backoff: 0.75}
		d.limit = overload.New(lc, now)
	}
	if reg != nil {
		stat := func(f func(overload.Stats) float64) func() float64 {
			return func() float64 { return f(d.limit.Stats()) }
		}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_handler_limit",
				Help: "The adaptive limit on handler calls in flight (overload.max_in_flight bounds it): it falls when the downstream's latency grows or a call times out."},
				stat(func(s overload.Stats) float64 { return float64(s.Limit) })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_handler_in_flight",
				Help: "Handler calls in flight now."},
				stat(func(s overload.Stats) float64 { return float64(s.InFlight) })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_handler_waiting",
				Help: "Messages waiting in their actors for a slot under the handler limit."},
				stat(func(s overload.Stats) float64 { return float64(s.Waiting) })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_handler_latency_seconds",
				Help: "Mean latency of the handler's last window of successful calls (about one limit's worth)."},
				stat(func(s overload.Stats) float64 { return s.Latency.Seconds() })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_handler_latency_baseline_seconds",
				Help: "The handler's latency when the downstream does not queue our calls; latency above overload.tolerance times it cuts the limit."},
				stat(func(s overload.Stats) float64 { return s.Baseline.Seconds() })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kfpipe_handler_limit_decreases_total",
				Help: "Times the handler limit was cut: the downstream's latency grew past the tolerance, or a call timed out."},
				stat(func(s overload.Stats) float64 { return float64(s.Decreases) })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kfpipe_handler_retries_deferred_total",
				Help: "Retries that found the retry budget (overload.retry_budget) spent and waited."},
				func() float64 { return float64(d.budget.Denied()) }),
		)
	}
	return d
}

// outcome is what a handler call tells the limiter: a timeout or a
// receiver's "too many requests" is congestion; an answer is a latency
// sample; a fast failure (a 503 in a few milliseconds, a refused
// connection) says nothing of the load and is ignored.
func outcomeOf(err error, timedOut bool) overload.Outcome {
	var ra *RetryAfterError
	switch {
	case err == nil || handler.IsPermanent(err):
		return overload.Success
	case timedOut, errors.As(err, &ra):
		return overload.Dropped
	default:
		return overload.Ignored
	}
}

// timedOut records that a call of user's timed out at now.
func (d *downstream) timedOut(user string, now time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timeouts[0].user != user {
		d.timeouts[1] = d.timeouts[0]
	}
	d.timeouts[0] = userTimeout{user: user, at: now}
}

// slowFor reports whether the downstream is slow for everyone, not only
// for user: it showed congestion within d and another user's call timed
// out within d too.
func (d *downstream) slowFor(user string, now time.Time, within time.Duration) bool {
	if d == nil || !d.limit.SlowWithin(within) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.timeouts {
		if t.user != "" && t.user != user && now.Sub(t.at) <= within {
			return true
		}
	}
	return false
}

// acquire waits for a slot under the limit (nil: none to wait for); a
// retry waits before the first attempts waiting.
func (d *downstream) acquire(ctx context.Context, retry bool) (time.Time, bool) {
	if d == nil {
		return time.Time{}, true
	}
	if retry {
		return d.limit.AcquireRetry(ctx)
	}
	return d.limit.Acquire(ctx)
}

// release ends a call acquire admitted.
func (d *downstream) release(start time.Time, o overload.Outcome) {
	if d != nil {
		d.limit.Release(start, o)
	}
}

// firstCall records a message's first call (it earns retry budget).
func (d *downstream) firstCall() {
	if d != nil {
		d.budget.Call()
	}
}

// retry reports whether the budget lets a retry go now.
func (d *downstream) retry() bool { return d == nil || d.budget.Retry() }

// isTimeout reports whether a handler's error is a timeout: the
// attempt's own deadline, or one the handler met (the http handler's
// handler.http.timeout, a client's).
func isTimeout(actx context.Context, err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(actx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// retryWait is how long a failed attempt's retry waits: backoff, longer
// when the receiver asked (Retry-After), and after a timeout at least as
// long as the call ran, so a receiver still working on it (it may answer
// late) is not called again at once.
func retryWait(backoff time.Duration, err error, timedOut bool, took time.Duration) time.Duration {
	wait := backoff
	var ra *RetryAfterError
	if errors.As(err, &ra) && ra.After > wait {
		wait = ra.After
	}
	if timedOut && took > wait {
		wait = took
	}
	return wait
}
