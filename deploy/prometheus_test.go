package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

const runbookBase = "https://github.com/kfpipe/kfpipe/blob/main/docs/operations.md#"

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	var rf ruleFile
	if err := yaml.UnmarshalStrict(readFile(t, "deploy", "prometheus", "alerts.yaml"), &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(readFile(t, "deploy", "grafana", "kfpipe.json"), &d); err != nil {
		t.Fatalf("kfpipe.json: %v", err)
	}
	return d
}

// dashboardExprs returns every panel query with Grafana's variables
// replaced by values PromQL accepts.
func dashboardExprs(t *testing.T) []string {
	var out []string
	r := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	for _, p := range loadDashboard(t).Panels {
		for _, q := range p.Targets {
			out = append(out, r.Replace(q.Expr))
		}
	}
	return out
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	tool := testenv.Tool(t, "promtool")
	cmd := exec.Command(tool, args...)
	cmd.Dir = repo(t, "deploy", "prometheus")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestPrometheusRulesCheck(t *testing.T) {
	t.Parallel()
	promtool(t, "check", "rules", "alerts.yaml")
}

func TestPrometheusRulesUnitTests(t *testing.T) {
	t.Parallel()
	promtool(t, "test", "rules", "alerts_test.yaml")
}

// TestDashboardQueriesParse hands every panel query to promtool as a
// recording rule, so a query Prometheus would reject fails here.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range dashboardExprs(t) {
		q, _ := json.Marshal(e)
		fmt.Fprintf(&b, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
	}
	p := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", p)
}

func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q title %q schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	var dsVar bool
	for _, v := range d.Templating.List {
		dsVar = dsVar || v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}
	if !dsVar {
		t.Error("no Prometheus datasource variable named datasource")
	}
	ids := map[int]bool{}
	titles := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: must query ${datasource}", p.Title)
		}
	}
	for _, want := range []string{"Messages per second", "Processing latency (produce → handled)", "Consumer lag by partition",
		"Active processors", "DLQ by reason", "Emergency writes and DLQ produce errors", "Rate-limit violations by group",
		"Blocked users", "Sync passes by result", "Produce latency (hand-off → acks=all)", "Produce errors"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
}

// slug is GitHub's heading anchor: lower case, punctuation dropped, spaces
// to hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(readFile(t, "docs", "operations.md")), "\n") {
		if strings.HasPrefix(line, "#") {
			anchors[slug(strings.TrimLeft(line, "#"))] = true
		}
	}
	severities := map[string]bool{"info": true, "warning": true, "critical": true, "emergency": true}
	names := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			names[r.Alert] = true
			if !severities[r.Labels["severity"]] {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description are required", r.Alert)
			}
			u := r.Annotations["runbook_url"]
			if u != runbookBase+strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, u, runbookBase, strings.ToLower(r.Alert))
			}
			if !anchors[strings.TrimPrefix(u, runbookBase)] {
				t.Errorf("%s: docs/operations.md has no heading for #%s", r.Alert, strings.TrimPrefix(u, runbookBase))
			}
		}
	}
	// The alerts docs/operations.md has runbooks for are all there.
	for _, want := range []string{"KfpipeConsumerLagHigh", "KfpipeRebalanceFrequent", "KfpipeProcessorLeak",
		"KfpipeDLQGrowthHigh", "KfpipeDLQGrowthAbnormal", "KfpipeDLQEmergencyWrite", "KfpipeDLQConsumerDown",
		"KfpipeDLQConsumerStalled", "KfpipeDLQUnrecoverable", "KfpipeDLQManualReviewBacklog", "KfpipeRateLimitViolations",
		"KfpipeUsersBlockedHigh", "KfpipeBlockedUsersCurrent", "KfpipeMassBlocking", "KfpipeProduceErrors",
		"KfpipeProducerDown", "KfpipeSyncStalled", "KfpipeIDGenErrors"} {
		if !names[want] {
			t.Errorf("alert %s missing", want)
		}
	}
}

var (
	stringLiteral = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	metricName    = regexp.MustCompile(`\bkfpipe_[a-zA-Z0-9_]+`)
)

// usedMetrics returns the kfpipe_ metric names the alert rules and the
// dashboard query, by the name the code registers (a histogram's _bucket,
// _sum and _count series belong to its base name, returned as suffixed so
// the caller can tell). String literals are removed first: a label value
// such as daemon="kfpipe_x" is not a metric.
func usedMetrics(t *testing.T) map[string][]string {
	used := map[string][]string{}
	add := func(where, expr string) {
		for _, m := range metricName.FindAllString(stringLiteral.ReplaceAllString(expr, `""`), -1) {
			used[m] = append(used[m], where)
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			add("alert "+r.Alert+r.Record, r.Expr)
		}
	}
	for i, e := range dashboardExprs(t) {
		add(fmt.Sprintf("dashboard query %d", i), e)
	}
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: the extraction is broken", len(used))
	}
	return used
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
