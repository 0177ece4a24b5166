package deploy

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/obs"
)

// ruleBound is the right-hand side of an alert expression's last
// comparison (">" or "=="), a number or a product of numbers ("24 * 3600").
func ruleBound(expr string, equal bool) (float64, bool) {
	op := ">"
	if equal {
		op = "=="
	}
	i := strings.LastIndex(expr, op)
	if i < 0 {
		return 0, false
	}
	v := 1.0
	for _, f := range strings.Split(strings.TrimSpace(expr[i+len(op):]), "*") {
		n, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return 0, false
		}
		v *= n
	}
	return v, true
}

// TestAlertThresholdsMatchTable: the console's health verdict grades by
// obs.Thresholds; each row must be its alert rule's bound, severity and
// hold time, so the console turns amber or red exactly where the rule
// would fire.
func TestAlertThresholdsMatchTable(t *testing.T) {
	t.Parallel()
	type rule struct{ expr, sev, hold string }
	rules := map[string]rule{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = rule{r.Expr, r.Labels["severity"], r.For}
		}
	}
	if len(obs.Thresholds) == 0 {
		t.Fatal("obs.Thresholds is empty")
	}
	for _, th := range obs.Thresholds {
		r, ok := rules[th.Alert]
		if !ok {
			t.Errorf("%s (area %s): no such alert in alerts.yaml", th.Alert, th.Area)
			continue
		}
		if r.sev != th.Severity {
			t.Errorf("%s: alerts.yaml severity %q, table %q", th.Alert, r.sev, th.Severity)
		}
		var hold time.Duration
		if r.hold != "" {
			var err error
			if hold, err = time.ParseDuration(r.hold); err != nil {
				t.Errorf("%s: for %q: %v", th.Alert, r.hold, err)
			}
		}
		if hold != th.For {
			t.Errorf("%s: alerts.yaml for %s, table %s", th.Alert, hold, th.For)
		}
		v, ok := ruleBound(r.expr, th.Equal)
		if !ok {
			t.Errorf("%s: no numeric bound at the end of %q", th.Alert, r.expr)
			continue
		}
		if v != th.Value {
			t.Errorf("%s: alerts.yaml bound %g, table %g", th.Alert, v, th.Value)
		}
	}
}

func TestRuleBound(t *testing.T) {
	for _, c := range []struct {
		expr  string
		equal bool
		want  float64
		ok    bool
	}{
		{"sum(x) > 10000", false, 10000, true},
		{"time() - min(y) > 24 * 3600", false, 86400, true},
		{"max(z) == 1", true, 1, true},
		{"max(z) == 1", false, 0, false},
		{"rate(x[5m]) > 3 * rate(x[1d])", false, 0, false},
	} {
		got, ok := ruleBound(c.expr, c.equal)
		if got != c.want || ok != c.ok {
			t.Errorf("ruleBound(%q, %v) = %g, %v; want %g, %v", c.expr, c.equal, got, ok, c.want, c.ok)
		}
	}
}
