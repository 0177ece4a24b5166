package consumer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/handler"
)

// metrics are the consumer's Prometheus series (kfpipe_ names; the alerts of
// docs/operations.md read them).
type metrics struct {
	consumed   prometheus.Counter
	processed  *prometheus.CounterVec // result: ok, duplicate, or a DLQ reason
	duplicates prometheus.Counter
	active     prometheus.Gauge
	latency    prometheus.Histogram
	commits    *prometheus.CounterVec // result: ok, error
	attemptsV  *prometheus.CounterVec // outcome of each handler attempt
	// priorFinished counts records skipped because the partition's previous
	// owner listed them finished in its commit; metaTruncated counts commits
	// whose list of finished offsets did not fit the metadata.
	priorFinished prometheus.Counter
	metaTruncated prometheus.Counter

	// results holds processed's children for the known results, bound
	// once so the per-message path does no label lookup. Read-only after
	// newMetrics.
	results map[string]prometheus.Counter
	// attempts holds attemptsV's children by outcome, bound once.
	attempts map[string]prometheus.Counter
	// part are the partitions' series; own counts what hand-overs did with
	// running attempts (own.go).
	part partMetrics
	own  ownMetrics
}

// partMetrics are the series of the partitions the consumer holds: the
// assignment and its rebalances, pauses, lag, the dead letters waiting, the
// standby.
type partMetrics struct {
	assigned   prometheus.Gauge
	rebalances *prometheus.CounterVec // type: assign, revoke, lost
	lag        *prometheus.GaugeVec   // partition
	paused     prometheus.Gauge
	// deadWaiting is the dead letters per partition not durable yet;
	// deadPaused the partitions paused because of them; deadPauses counts
	// those pauses.
	deadWaiting *prometheus.GaugeVec // partition
	deadPaused  prometheus.Gauge
	deadPauses  prometheus.Counter
	// standby is 1 while the consumer is out of its group on purpose
	// (SetStandby), standbys counts the times it left.
	standby  prometheus.Gauge
	standbys prometheus.Counter
}

// Results of kfpipe_messages_processed_total besides the DLQ reasons.
const (
	resultOK        = "ok"
	resultDuplicate = "duplicate"
)

// result returns the processed counter for result.
func (m *metrics) result(result string) prometheus.Counter {
	if c, ok := m.results[result]; ok {
		return c
	}
	return m.processed.WithLabelValues(result)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		consumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_messages_consumed_total", Help: "Records read from the main topic."}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_messages_processed_total",
			Help: "Messages finished, by result: ok, duplicate, or the dead-letter reason."}, []string{"result"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_messages_duplicate_total", Help: "Messages skipped because their dedup key was done."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_active_processors", Help: "Live per-user actors."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kfpipe_processing_latency_seconds", Help: "From produce (produced_at) to handled.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		priorFinished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_consumer_finished_by_previous_owner_total",
			Help: "Records not run again because the partition's previous owner had finished them behind an unfinished one (listed in its offset commit)."}),
		metaTruncated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_consumer_offset_metadata_truncated_total",
			Help: "Offset commits whose list of finished offsets did not fit the commit metadata; the offsets left out are read again by the next owner."}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_commits_total", Help: "Offset commits by result: ok, error."}, []string{"result"}),
		attemptsV: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_handler_attempts_total",
			Help: "Handler attempts by outcome: ok, failed, timeout, permanent; abandoned counts retries not made because the partition was revoked or lost. A failed or timed-out attempt may still have had its effect."},
			[]string{"outcome"}),
	}
	m.part = partMetrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kfpipe_consumer_lag", Help: "High watermark minus the committable offset, per partition."},
			[]string{"partition"}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_partitions_paused", Help: "Partitions paused by the in-flight cap."}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_rebalances_total", Help: "Rebalance events by type: assign, revoke, lost."}, []string{"type"}),
		deadWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kfpipe_dead_letters_waiting",
			Help: "Dead letters per partition waiting for their durable DLQ write (their offsets are not committed yet)."},
			[]string{"partition"}),
		deadPaused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_partitions_paused_dead_letters",
			Help: "Partitions paused because processor.dead_letter_queue dead letters wait for the DLQ."}),
		deadPauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dead_letter_pauses_total",
			Help: "Times a partition was paused because its dead-letter queue was full."}),
		standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_consumer_standby",
			Help: "1 while the consumer has left its group because it cannot protect effects (Redis unreachable); its partitions go to the other members."}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kfpipe_consumer_partitions_assigned",
			Help: "Main-topic partitions the consumer holds now; summed over the group, 0 means nobody consumes the topic (alert KfpipeNoPartitionConsumed)."}),
		standbys: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_consumer_standbys_total", Help: "Times the consumer left its group on standby."}),
	}
	m.attempts = map[string]prometheus.Counter{}
	for _, o := range []string{attemptOK, attemptFailed, attemptTimeout, attemptPermanent, attemptAbandoned} {
		m.attempts[o] = m.attemptsV.WithLabelValues(o)
	}
	m.results = map[string]prometheus.Counter{}
	for _, r := range append([]string{resultOK, resultDuplicate}, deadletter.Names()...) {
		m.results[r] = m.processed.WithLabelValues(r)
	}
	m.own = newOwnMetrics(reg)
	if reg != nil {
		p := m.part
		reg.MustRegister(m.consumed, m.processed, m.duplicates, m.active, m.latency, p.lag, p.paused,
			p.rebalances, m.commits, m.attemptsV, p.deadWaiting, p.deadPaused, p.deadPauses, p.standby, p.standbys, p.assigned,
			m.priorFinished, m.metaTruncated)
	}
	return m
}

// ownMetrics are the hand-over's series.
type ownMetrics struct {
	handedOver *prometheus.CounterVec // fate: awaited, cancelled, lapsed
	notOwner   prometheus.Counter
}

func newOwnMetrics(reg prometheus.Registerer) ownMetrics {
	m := ownMetrics{
		handedOver: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_handover_attempts_total",
			Help: "Handler attempts running when their partition was handed over (revoke, loss, stop), by fate: awaited (ended within kafka.consumer.revoke_drain_limit), cancelled (their context cancelled at the limit), lapsed (still running after the cancel: the lease was left to lapse, not given back)."},
			[]string{"fate"}),
		notOwner: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_attempts_not_owner_total",
			Help: "Handler attempts not started because the partition's lease was past its local deadline (a paused or cut-off owner): the message is looked up again under the next lease."}),
	}
	for _, f := range []string{"awaited", "cancelled", "lapsed"} {
		m.handedOver.WithLabelValues(f)
	}
	if reg != nil {
		reg.MustRegister(m.handedOver, m.notOwner)
	}
	return m
}

// Handler attempt outcomes (kfpipe_handler_attempts_total's label).
const (
	attemptOK        = "ok"
	attemptFailed    = "failed"
	attemptTimeout   = "timeout"
	attemptPermanent = "permanent"
	attemptAbandoned = "abandoned" // retry not made: the partition was revoked or lost
)

func attemptOutcome(err error, timedOut bool) string {
	switch {
	case err == nil:
		return attemptOK
	case handler.IsPermanent(err):
		return attemptPermanent
	case timedOut:
		return attemptTimeout
	default:
		return attemptFailed
	}
}
