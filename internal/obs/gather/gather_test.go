package gather

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kfpipe_x_total"}, []string{"result", "shard"})
	reg.MustRegister(c)
	c.WithLabelValues("ok", "a").Add(2)
	c.WithLabelValues("ok", "b").Add(3)
	c.WithLabelValues("failed", "a").Add(7)

	for _, tc := range []struct {
		labels []string
		sum    float64
		found  bool
	}{
		{nil, 12, true},
		{[]string{"result", "ok"}, 5, true},
		{[]string{"result", "ok", "shard", "b"}, 3, true},
		{[]string{"result", "gone"}, 0, false},
	} {
		sum, found, err := Sum(reg, "kfpipe_x_total", tc.labels...)
		if err != nil || sum != tc.sum || found != tc.found {
			t.Errorf("Sum(%q) = %v, %v, %v; want %v, %v, nil", tc.labels, sum, found, err, tc.sum, tc.found)
		}
	}
	if _, found, err := Sum(reg, "kfpipe_never_registered"); found || err != nil {
		t.Errorf("an unregistered family: found=%v err=%v; want false, nil", found, err)
	}
	if _, _, err := Sum(reg, "kfpipe_x_total", "result"); err == nil {
		t.Error("an odd label list was accepted")
	}
}
