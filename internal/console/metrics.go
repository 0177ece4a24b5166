package console

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests      *prometheus.CounterVec
	auditFailures prometheus.Counter
	batchLetters  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_admin_requests_total", Help: "Admin API requests by route pattern and status code."},
			[]string{"route", "code"}),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_admin_audit_failures_total", Help: "Audit entries that could not be written to the Redis stream (the log line still has them)."}),
		batchLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_admin_batch_letters_total", Help: "Letters operators' batches went through, by action (retry, purge)."},
			[]string{"action"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.auditFailures, m.batchLetters)
	}
	return m
}
