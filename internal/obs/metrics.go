package obs

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name of the project.
const Namespace = "kfpipe"

// NewRegistry returns a registry with the Go runtime and process collectors
// and a build-info gauge.
func NewRegistry(daemon, version string) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   Namespace,
		Name:        "build_info",
		Help:        "Build information; always 1.",
		ConstLabels: prometheus.Labels{"daemon": daemon, "version": version},
	})
	info.Set(1)
	r.MustRegister(info)
	return r
}

// RegisterShared registers c on reg, or returns the collector of the same
// description already there: several clients of one package (generators,
// allocators, providers) may share a registry.
func RegisterShared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
