package coord

import (
	"github.com/kfpipe/kfpipe/internal/obs"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Option customises New.
type Option func(*options)

type options struct {
	logger *zap.Logger
	reg    prometheus.Registerer
}

// WithLogger sets the logger of the Provider and of its etcd client
// (default: no logging).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer registers the kfpipe_coord_* metrics on reg; without it
// nothing is registered.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// Label values of kfpipe_coord_lease_losses_total.
const (
	kindRegistry   = "registry"
	kindLock       = "lock"
	kindInstanceID = "instance_id"
)

type metrics struct {
	resyncs  prometheus.Counter
	restarts prometheus.Counter
	lost     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_coord_watch_resyncs_total",
			Help: "Watches whose resume revision had been compacted, so they reloaded the current state.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_coord_watch_restarts_total",
			Help: "Watches re-established after their etcd watch ended (connection, leader change, compaction).",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_coord_lease_losses_total",
			Help: "Leases that expired or were revoked while held, by holder kind (registry, lock, instance_id).",
		}, []string{"kind"}),
	}
	for _, k := range []string{kindRegistry, kindLock, kindInstanceID} {
		m.lost.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	// Several Providers may share one registry: reuse what is there.
	var err error
	if m.resyncs, err = obs.RegisterShared(reg, m.resyncs); err != nil {
		return nil, err
	}
	if m.restarts, err = obs.RegisterShared(reg, m.restarts); err != nil {
		return nil, err
	}
	if m.lost, err = obs.RegisterShared(reg, m.lost); err != nil {
		return nil, err
	}
	return m, nil
}
