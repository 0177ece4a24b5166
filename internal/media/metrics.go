package media

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kfpipe_media_* series.
type metrics struct {
	kept     *prometheus.CounterVec
	failures *prometheus.CounterVec
	refused  *prometheus.CounterVec
	bytes    prometheus.Counter
	dropped  prometheus.Counter
	queued   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		kept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_media_kept_total",
			Help: "Inbound media objects by stage (producer, consumer) and result: stored, already (in the store), refused (over media.max_bytes), expired (WeChat no longer had it), failed (retries exhausted).",
		}, []string{"stage", "result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_media_failures_total",
			Help: "Failed attempts to keep a media object, by stage and reason (fetch, store, errcode_<n>); each is retried up to media.retries times.",
		}, []string{"stage", "reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_media_refused_total",
			Help: "Media objects refused, by reason (too_large).",
		}, []string{"reason"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_media_bytes_total",
			Help: "Bytes of media written to the media store.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_media_queue_dropped_total",
			Help: "Media jobs kf-producer's stage could not queue (queue full); the consumer keeps them before the handler runs.",
		}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_media_queue_depth",
			Help: "Media jobs waiting in kf-producer's stage.",
		}),
	}
	if reg != nil {
		m.kept = register(reg, m.kept)
		m.failures = register(reg, m.failures)
		m.refused = register(reg, m.refused)
		m.bytes = register(reg, m.bytes)
		m.dropped = register(reg, m.dropped)
		m.queued = register(reg, m.queued)
	}
	return m
}

// register registers c on reg, or returns the collector already there
// (a test or a daemon that builds two keepers on one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}
