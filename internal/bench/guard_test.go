package bench

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// The one-store switch took consumer_pipeline from 19.87 to 29.57 µs a
// message and its ratio from 0.399 to 0.199 (BENCHMARKS.md): the guard
// must flag exactly that, and leave the same-run noise alone.
func TestGuardFlagsTheOneStoreRegression(t *testing.T) {
	base := Baseline{Source: "test", Rows: map[string]map[string]float64{
		"consumer_pipeline":               {"cpu_us_per_msg": 19.87, "redis_cpu_us_per_msg": 8.14, "ratio": 0.399},
		"producer_pipeline":               {"ratio": 0.74},
		"state_dense_pipeline_legacy_off": {"cpu_us_per_msg": 26.44},
		"gone_row":                        {"ratio": 1},
	}}
	results := []Result{
		{Scenario: "consumer_pipeline", Ratio: 0.199, Extra: map[string]any{"cpu_us_per_msg": 29.57, "redis_cpu_us_per_msg": 3.63}},
		{Scenario: "producer_pipeline", Ratio: 0.70}, // 5% lower: noise
		{Scenario: "state_dense_pipeline_legacy_off", Extra: map[string]any{"cpu_us_per_msg": 28.0}},
		{Scenario: "state_write-once_pipeline_legacy_off", Extra: map[string]any{"cpu_us_per_msg": 49.6}},
	}
	rows, notRun := Compare(base, results)
	if len(rows) != 4 {
		t.Fatalf("rows = %d, want 4", len(rows))
	}
	byRow := map[string]Comparison{}
	for _, c := range rows {
		byRow[c.Row] = c
	}
	cp := byRow["consumer_pipeline"]
	if strings.Join(cp.Worse, ",") != "cpu_us_per_msg,ratio" {
		t.Errorf("consumer_pipeline worse = %v, want cpu_us_per_msg and ratio (Redis CPU fell, which is better)", cp.Worse)
	}
	if ch := cp.Changes["redis_cpu_us_per_msg"]; ch >= 0 {
		t.Errorf("Redis CPU 8.14→3.63 reads as change %v, want negative (better)", ch)
	}
	if w := byRow["producer_pipeline"].Worse; len(w) != 0 {
		t.Errorf("a 5%% lower ratio flagged: %v", w)
	}
	if w := byRow["state_dense_pipeline_legacy_off"].Worse; len(w) != 0 {
		t.Errorf("a 6%% higher CPU flagged: %v", w)
	}
	if !byRow["state_write-once_pipeline_legacy_off"].New {
		t.Errorf("a row with no baseline is not reported new")
	}
	if len(notRun) != 1 || notRun[0] != "gone_row" {
		t.Errorf("not run = %v, want [gone_row]", notRun)
	}
	var out bytes.Buffer
	if n := PrintComparison(&out, base, rows, notRun); n != 1 {
		t.Errorf("PrintComparison counted %d worse rows, want 1:\n%s", n, out.String())
	}
	for _, want := range []string{"WORSE: cpu_us_per_msg, ratio", "19.87→29.57 (+49%)", "new row", "not run this time", "1 of 4 rows worse"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestGuardAcceptRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	base, err := ReadBaseline(path)
	if err != nil || len(base.Rows) != 0 {
		t.Fatalf("missing baseline: %v, %v", base, err)
	}
	results, err := ReadResults(strings.NewReader(
		`{"scenario":"consumer_pipeline","ratio":0.3,"extra":{"cpu_us_per_msg":20}}` + "\n\n" +
			`{"scenario":"memory_100k_users","extra":{"rss":5}}` + "\n" +
			`{"scenario":"e2e_latency_5k","ratio":1.4,"extra":{"ratio_of":"p99 / baseline p99"}}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteBaseline(path, Accept(base, results, "run X")); err != nil {
		t.Fatal(err)
	}
	again, err := ReadBaseline(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.Source != "run X" || again.Rows["consumer_pipeline"]["cpu_us_per_msg"] != 20 || again.Rows["consumer_pipeline"]["ratio"] != 0.3 {
		t.Errorf("accepted baseline = %+v", again)
	}
	if _, ok := again.Rows["e2e_latency_5k"]; ok {
		t.Errorf("a latency ratio (higher is worse) was kept as a throughput ratio: %+v", again.Rows)
	}
	if _, ok := again.Rows["memory_100k_users"]; ok {
		t.Errorf("a row with no guarded figure was accepted: %+v", again.Rows)
	}
	if rows, _ := Compare(again, results); len(rows[0].Worse) != 0 || rows[0].New {
		t.Errorf("a run compared with its own figures: %+v", rows[0])
	}
}

func TestGuardRejectsABrokenResultsLine(t *testing.T) {
	_, err := ReadResults(strings.NewReader(`{"scenario":"a"}` + "\n" + `not json` + "\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v, want one naming line 2", err)
	}
}
