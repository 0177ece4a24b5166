// Package gather reads values out of a Prometheus registry. It is a leaf
// (client_golang only), so tests of any package can use it.
package gather

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum gathers g and sums the counter, gauge and untyped series of the
// family name whose labels include every pair of labels ("result", "ok",
// ...). found reports whether any series matched, so a metric that was
// never registered reads apart from one at 0. It is the one reader of a
// registry's values: the demo's report, the tests (testenv.Gathered) and
// the tools use it.
func Sum(g prometheus.Gatherer, name string, labels ...string) (sum float64, found bool, err error) {
	if len(labels)%2 != 0 {
		return 0, false, fmt.Errorf("gather.Sum(%s): labels %q are not name, value pairs", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, fmt.Errorf("gather.Sum(%s): gather: %w", name, err)
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
