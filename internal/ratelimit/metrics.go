package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Decision results, the values of the result label.
const (
	resultAllowed = "allowed"
)

type limiterMetrics struct {
	violations  *prometheus.CounterVec
	blocks      *prometheus.CounterVec
	decisions   *prometheus.CounterVec
	allowed     prometheus.Counter
	rateLimited prometheus.Counter
	userBlocked prometheus.Counter
}

// newLimiterMetrics creates the limiter's metrics; blockedCurrent reports
// kfpipe_blocked_users_current at scrape time.
func newLimiterMetrics(reg prometheus.Registerer, blockedCurrent func() float64) *limiterMetrics {
	m := &limiterMetrics{
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_rate_limit_violations_total",
			Help: "Messages refused because the user's window was full (each is a violation).",
		}, []string{"group"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_users_blocked_total",
			Help: "Automatic blocks started by this node's limiter.",
		}, []string{"group"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_rate_limit_decisions_total",
			Help: "Limiter decisions by result (allowed, rate_limited, user_blocked).",
		}, []string{"result"}),
	}
	m.allowed = m.decisions.WithLabelValues(resultAllowed)
	m.rateLimited = m.decisions.WithLabelValues(ReasonRateLimited)
	m.userBlocked = m.decisions.WithLabelValues(ReasonUserBlocked)
	if reg != nil {
		reg.MustRegister(m.violations, m.blocks, m.decisions, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kfpipe_blocked_users_current",
			Help: "Users blocked right now (cluster-wide from Redis when a store is configured).",
		}, blockedCurrent))
	}
	return m
}

type breakerMetrics struct {
	toClosed, toOpen, toHalfOpen prometheus.Counter
	open                         prometheus.Gauge
}

func newBreakerMetrics(reg prometheus.Registerer) *breakerMetrics {
	changes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_circuit_breaker_state_changes_total",
		Help: "Per-user circuit breaker transitions by target state.",
	}, []string{"to"})
	m := &breakerMetrics{
		toClosed:   changes.WithLabelValues(StateClosed.String()),
		toOpen:     changes.WithLabelValues(StateOpen.String()),
		toHalfOpen: changes.WithLabelValues(StateHalfOpen.String()),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_circuit_breakers_open",
			Help: "Per-user circuit breakers currently open (half-open not counted).",
		}),
	}
	if reg != nil {
		reg.MustRegister(changes, m.open)
	}
	return m
}
