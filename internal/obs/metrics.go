package obs

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kfpipe/kfpipe/internal/version"
)

// Namespace prefixes every metric name of the project.
const Namespace = "kfpipe"

// NewRegistry returns a registry with the Go runtime and process collectors
// and a build-info gauge.
func NewRegistry(daemon, version string) *prometheus.Registry {
	return NewRegistryLabels(daemon, prometheus.Labels{"version": version})
}

// BuildLabels are kfpipe_build_info's labels for a build: version, commit,
// build date, Go and librdkafka versions.
func BuildLabels(i version.Info) prometheus.Labels {
	return prometheus.Labels{"version": i.Version, "commit": i.Commit, "build_date": i.Date,
		"go_version": i.Go, "librdkafka_version": i.Librdkafka}
}

// NewRegistryLabels is NewRegistry with kfpipe_build_info carrying labels
// (BuildLabels) besides the daemon's name.
func NewRegistryLabels(daemon string, labels prometheus.Labels) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	constLabels := prometheus.Labels{"daemon": daemon}
	for k, v := range labels {
		constLabels[k] = v
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   Namespace,
		Name:        "build_info",
		Help:        "Build information; always 1.",
		ConstLabels: constLabels,
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
