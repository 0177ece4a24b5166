package obs

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

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

// Sum gathers g and sums the counter, gauge and untyped series of the
// family name whose labels include every pair of labels ("result", "ok",
// ...). found reports whether any series matched, so a metric that was
// never registered reads apart from one at 0. It is the one reader of a
// registry's values: the demo's report, the tests (testenv.Gathered) and
// the tools use it.
func Sum(g prometheus.Gatherer, name string, labels ...string) (sum float64, found bool, err error) {
	if len(labels)%2 != 0 {
		return 0, false, fmt.Errorf("obs.Sum(%s): labels %q are not name, value pairs", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, fmt.Errorf("obs.Sum(%s): gather: %w", name, err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			found = true
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Untyped != nil:
				sum += m.Untyped.GetValue()
			}
		}
	}
	return sum, found, nil
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i < len(pairs); i += 2 {
		ok := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == pairs[i] && lp.GetValue() == pairs[i+1] {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
