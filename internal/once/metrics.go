package once

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	executed, failed, duplicate, errored prometheus.Counter
	waits, leaseLost, markConflict       prometheus.Counter
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
		Help: "Calls whose processing claim expired, was taken over, or went unrenewed for most of its lease (given up) while f ran or its done mark was on its way.",
	})
	conflict := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_once_mark_conflicts_total", ConstLabels: labels,
		Help: "Done marks that found another caller's live claim on the key (this call's claim had expired while f ran) and left it alone: that caller may run the effect again.",
	})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kfpipe_once_batch_ops", ConstLabels: labels,
		Help:    "Operations per Redis pipeline sent by the batcher.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	if reg != nil {
		reg.MustRegister(calls, waits, lost, conflict, batch)
	}
	return &metrics{
		executed:     calls.WithLabelValues("executed"),
		failed:       calls.WithLabelValues("failed"),
		duplicate:    calls.WithLabelValues("duplicate"),
		errored:      calls.WithLabelValues("error"),
		waits:        waits,
		leaseLost:    lost,
		markConflict: conflict,
		batchOps:     batch,
	}
}

// registerWaitGauges exports the calls waiting on claims held by others.
func registerWaitGauges(service string, reg prometheus.Registerer, c *Client) {
	if reg == nil {
		return
	}
	labels := prometheus.Labels{"service": service}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kfpipe_once_waiting", ConstLabels: labels,
			Help: "Calls now waiting on a claim held by another caller (after a crash: the dead owner's claims, until their lease expires).",
		}, func() float64 { return float64(c.Waiting().Count) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kfpipe_once_oldest_wait_seconds", ConstLabels: labels,
			Help: "How long the longest-waiting call has waited on a claim held by another caller.",
		}, func() float64 { return c.Waiting().Oldest.Seconds() }),
	)
}
