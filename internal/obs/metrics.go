package obs

import (
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
