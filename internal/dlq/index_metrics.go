package dlq

import (
	"github.com/prometheus/client_golang/prometheus"
)

// indexMetrics are the index's counters, registered by NewIndex.
type indexMetrics struct {
	indexed            *prometheus.CounterVec
	undecodableEntries prometheus.Counter
	gone               prometheus.Counter
}

func newIndexMetrics(reg prometheus.Registerer) indexMetrics {
	return indexMetrics{
		indexed: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_dlq_index_total", Help: "DLQ records applied to the Redis index, by result (new, duplicate, expired, event, full)."},
			[]string{"result"})),
		undecodableEntries: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_index_undecodable_entries_total",
			Help: "Index entries the scheduler could not decode; each is moved to review instead of failing the scan."})),
		gone: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_letters_gone_total",
			Help: "Due dead letters the DLQ topic no longer held (retention shorter than the index TTL); each is moved to review."})),
	}
}
