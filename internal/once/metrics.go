package once

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	executed, failed, duplicate, errored prometheus.Counter
	waits, leaseLost                     prometheus.Counter
	batchOps                             prometheus.Observer
}

func newMetrics(service string, reg prometheus.Registerer) *metrics {
	labels := prometheus.Labels{"service": service}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_once_calls_total", ConstLabels: labels,
		Help: "Idempotent calls by result: executed (f succeeded), failed (f returned an error, key released), duplicate (already done, f not called), error (Redis or context error).",
	}, []string{"result"})
	waits := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_once_waits_total", ConstLabels: labels,
		Help: "Calls that found another caller's processing claim and waited for it.",
	})
	lost := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_once_lease_lost_total", ConstLabels: labels,
		Help: "Calls whose processing claim expired or was taken over while f ran.",
	})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kfpipe_once_batch_ops", ConstLabels: labels,
		Help:    "Operations per Redis pipeline sent by the batcher.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	if reg != nil {
		reg.MustRegister(calls, waits, lost, batch)
	}
	return &metrics{
		executed:  calls.WithLabelValues("executed"),
		failed:    calls.WithLabelValues("failed"),
		duplicate: calls.WithLabelValues("duplicate"),
		errored:   calls.WithLabelValues("error"),
		waits:     waits,
		leaseLost: lost,
		batchOps:  batch,
	}
}
