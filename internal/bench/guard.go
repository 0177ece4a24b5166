package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// The regression guard: `make bench` keeps the last accepted figures in a
// committed file (bench/baseline.json) and, at the end of every run, prints
// for each row the change in the figures that say what a message costs,
// flagging a row that got worse by more than GuardTolerance. A figure that
// nobody compared is how the one-store switch cost 50% more CPU a message
// unnoticed; the guard is that comparison, made every time.
//
// Rows are matched by RowKey (the scenario's name). A row in the results with no baseline is
// reported as new, a baseline row the run did not produce as not run: both
// are facts, neither a failure.

// GuardTolerance is how much worse a figure may get before the guard flags
// it: 20%, wider than the same-run noise of the two-core box (BENCHMARKS.md
// puts alternated same-build pairs within ~10%), narrow enough for the 50%
// the one-store switch cost.
const GuardTolerance = 0.20

// guardMetric is one compared figure: where it sits in a Result and which
// way is better.
type guardMetric struct {
	name        string
	higherIsBad bool
}

// guardMetrics are the figures a regression is read from: CPU a message
// (the process's and Redis's) and the share of the raw loop's rate. Raw
// msg/s is left out: on a shared box it moves with the load, which the
// ratio (a same-run quotient) cancels.
var guardMetrics = []guardMetric{
	{"cpu_us_per_msg", true},
	{"redis_cpu_us_per_msg", true},
	{"ratio", false},
}

// Baseline is the committed file: the accepted figures per row, and where
// they came from.
type Baseline struct {
	// Source says which run the figures were taken from (date, commit,
	// command, load), for the person who reads a flag.
	Source string                        `json:"source"`
	Rows   map[string]map[string]float64 `json:"rows"`
}

// RowKey names a result row: its scenario. Every row's scenario name is
// unique within a run already (the state scenario's names carry the
// workload, the legacy mode and "_cluster"), so the name is the key.
func RowKey(r Result) string { return r.Scenario }

// figures reads the guarded figures of a result; a figure that is absent
// or not positive is left out (a row that did not measure it).
func figures(r Result) map[string]float64 {
	out := map[string]float64{}
	for _, m := range guardMetrics {
		var v float64
		switch m.name {
		case "ratio":
			// A latency row's ratio is p99 over the baseline's p99
			// (extra.ratio_of), where higher is worse: the guard keeps
			// throughput ratios only, so a direction is never mixed up.
			if of, _ := r.Extra["ratio_of"].(string); strings.Contains(of, "p99") {
				continue
			}
			v = r.Ratio
		default:
			f, ok := r.Extra[m.name].(float64)
			if !ok {
				continue
			}
			v = f
		}
		if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			out[m.name] = v
		}
	}
	return out
}

// ReadResults reads the JSON lines a run wrote (results.jsonl). A line
// that is not a result is an error naming its number: a guard that
// silently skipped a row would compare nothing.
func ReadResults(r io.Reader) ([]Result, error) {
	var out []Result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var res Result
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			return nil, fmt.Errorf("results line %d: %w", n, err)
		}
		if res.Scenario == "" {
			return nil, fmt.Errorf("results line %d: no scenario", n)
		}
		out = append(out, res)
	}
	return out, sc.Err()
}

// Comparison is the guard's verdict on one row.
type Comparison struct {
	Row string
	// Changes: for each figure both sides have, the relative change,
	// signed so that positive is worse.
	Changes map[string]float64
	Base    map[string]float64
	Now     map[string]float64
	// Worse lists the figures past GuardTolerance.
	Worse []string
	// New: the row has no accepted figures yet.
	New bool
}

// Compare matches a run's rows against the baseline. It returns one
// comparison a row of the run (in the run's order), and the baseline rows
// the run did not produce.
func Compare(base Baseline, results []Result) (rows []Comparison, notRun []string) {
	seen := map[string]bool{}
	for _, r := range results {
		key := RowKey(r)
		if seen[key] {
			continue // a repeated row (a scenario run twice): the first counts
		}
		seen[key] = true
		now := figures(r)
		c := Comparison{Row: key, Now: now, Changes: map[string]float64{}}
		b, ok := base.Rows[key]
		if !ok {
			c.New = true
			rows = append(rows, c)
			continue
		}
		c.Base = b
		for _, m := range guardMetrics {
			bv, bok := b[m.name]
			nv, nok := now[m.name]
			if !bok || !nok || bv <= 0 {
				continue
			}
			change := (nv - bv) / bv
			if !m.higherIsBad {
				change = -change
			}
			c.Changes[m.name] = change
			if change > GuardTolerance {
				c.Worse = append(c.Worse, m.name)
			}
		}
		rows = append(rows, c)
	}
	for key := range base.Rows {
		if !seen[key] {
			notRun = append(notRun, key)
		}
	}
	sort.Strings(notRun)
	return rows, notRun
}

// Accept folds a run's rows into the baseline (a row the run produced
// replaces its accepted figures; the others stay).
func Accept(base Baseline, results []Result, source string) Baseline {
	if base.Rows == nil {
		base.Rows = map[string]map[string]float64{}
	}
	for _, r := range results {
		if f := figures(r); len(f) > 0 {
			base.Rows[RowKey(r)] = f
		}
	}
	base.Source = source
	return base
}

// ReadBaseline reads the committed file; a missing file is an empty
// baseline (every row new).
func ReadBaseline(path string) (Baseline, error) {
	var b Baseline
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return Baseline{Rows: map[string]map[string]float64{}}, nil
	}
	if err != nil {
		return b, err
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return b, fmt.Errorf("%s: %w", path, err)
	}
	if b.Rows == nil {
		b.Rows = map[string]map[string]float64{}
	}
	return b, nil
}

// WriteBaseline writes the file sorted and indented, so that its diff in
// a commit reads row by row.
func WriteBaseline(path string, b Baseline) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// PrintComparison writes the guard's table and returns how many rows got
// worse past the tolerance.
func PrintComparison(w io.Writer, base Baseline, rows []Comparison, notRun []string) int {
	fmt.Fprintf(w, "regression guard: against %s (flag: > %.0f%% worse)\n", base.Source, GuardTolerance*100)
	worse := 0
	for _, c := range rows {
		if c.New {
			fmt.Fprintf(w, "  %-48s new row, no accepted figures (%s)\n", c.Row, fmtFigures(c.Now))
			continue
		}
		var parts []string
		for _, m := range guardMetrics {
			ch, ok := c.Changes[m.name]
			if !ok {
				continue
			}
			// Shown as the figure's own change (+ = the number went up).
			raw := ch
			if !m.higherIsBad {
				raw = -ch
			}
			parts = append(parts, fmt.Sprintf("%s %.4g→%.4g (%+.0f%%)", m.name, c.Base[m.name], c.Now[m.name], raw*100))
		}
		verdict := "ok"
		if len(c.Worse) > 0 {
			verdict = "WORSE: " + strings.Join(c.Worse, ", ")
			worse++
		}
		if len(parts) == 0 {
			verdict = "no figure to compare"
		}
		fmt.Fprintf(w, "  %-48s %-12s %s\n", c.Row, verdict, strings.Join(parts, "  "))
	}
	for _, key := range notRun {
		fmt.Fprintf(w, "  %-48s not run this time\n", key)
	}
	fmt.Fprintf(w, "regression guard: %d of %d rows worse by more than %.0f%%\n", worse, len(rows), GuardTolerance*100)
	return worse
}

func fmtFigures(f map[string]float64) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.4g", k, f[k]))
	}
	return strings.Join(parts, "  ")
}
