package chaos

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The soak's judge (TestSoak, build tag soak), here so its unit test runs
// in make test.

// soakSample is one row of the soak's CSV.
type soakSample struct {
	at     time.Duration
	values map[string]float64
}

// soakSeries are the sampled series, in CSV column order.
var soakSeries = []string{"rss_mib", "heap_mib", "goroutines", "fds", "redis_mib", "redis_keys", "lag", "processed"}

// judgeSoak fits each series after the warm-up and reports its slope per
// hour; a series that drifts fails the soak.
func judgeSoak(samples []soakSample, warm time.Duration, rate float64, rec *Report) {
	var xs []float64
	cols := map[string][]float64{}
	for _, s := range samples {
		if s.at < warm {
			continue
		}
		xs = append(xs, s.at.Hours())
		for _, c := range soakSeries {
			cols[c] = append(cols[c], s.values[c])
		}
	}
	if len(xs) < 6 {
		rec.Problem("only %d samples after the warm-up: too short to judge", len(xs))
		return
	}
	for _, c := range []string{"rss_mib", "heap_mib", "goroutines", "fds", "lag"} {
		slope, mean, se := fit(xs, cols[c])
		rec.Extra(c+"_mean", math.Round(mean*10)/10)
		rec.Extra(c+"_slope_per_h", math.Round(slope*10)/10)
		rec.Extra(c+"_slope_2se", math.Round(2*se*10)/10)
		bound := 0.10 * math.Abs(mean)
		if c == "goroutines" || c == "fds" {
			bound = max(bound, 5)
		}
		if c == "lag" {
			bound = max(bound, rate) // a second of messages an hour
		}
		// Growth is what leaks look like; a series that falls (goroutines
		// of a finished burst, lag catching up) is not judged. A series
		// grows when its slope exceeds the bound beyond the noise: the
		// lower end of the slope's 95 % interval (slope − 2 standard
		// errors) above the bound. A GC's sawtooth or a burst of actors
		// moves a 20-minute fit by more than the bound without anything
		// leaking; a leak the bound names stays above it however noisy.
		if slope-2*se > bound {
			rec.Problem("%s grows by %.1f ± %.1f an hour after the warm-up (mean %.1f, bound %.1f)", c, slope, 2*se, mean, bound)
		}
	}
	redisSlope, _, _ := fit(xs, cols["redis_mib"])
	procSlope, _, _ := fit(xs, cols["processed"])
	if procSlope > 0 {
		rec.Extra("redis_bytes_per_processed_message", math.Round(redisSlope*(1<<20)/procSlope))
	}
}

// fit is the least-squares slope of ys over xs, the mean of ys and the
// slope's standard error.
func fit(xs, ys []float64) (slope, mean, se float64) {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range xs {
		sxx += (xs[i] - mx) * (xs[i] - mx)
		sxy += (xs[i] - mx) * (ys[i] - my)
	}
	if sxx == 0 || n < 3 {
		return 0, my, 0
	}
	slope = sxy / sxx
	var res float64
	for i := range xs {
		d := ys[i] - (my + slope*(xs[i]-mx))
		res += d * d
	}
	return slope, my, math.Sqrt(res / (n - 2) / sxx)
}

// TestJudgeSoak: under the heap's noise (a sawtooth of ±5 % of the mean
// between samples), a leak of 20 % of the mean an hour is judged growing,
// no leak is not (whatever the noise's draw), nor is a series that falls;
// the slope and its interval are reported. The noise costs resolution: a
// leak must clear the bound by two standard errors (about 11 MiB/h here,
// 20 MiB/h in the recorded soak's heap, 3 in its RSS, which is smooth and
// holds the heap, so RSS is where a small leak shows first).
func TestJudgeSoak(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	series := func(leakPerH float64) []soakSample {
		var out []soakSample
		for i := range 180 { // 30 minutes every 10 s
			at := time.Duration(i) * 10 * time.Second
			noise := (rnd.Float64() - 0.5) * 20 // ±10 on a mean of 200: a GC's sawtooth
			v := map[string]float64{"rss_mib": 300, "heap_mib": 200 + noise + leakPerH*at.Hours(),
				"goroutines": 600 - 50*at.Hours(), "fds": 280, "lag": 100}
			out = append(out, soakSample{at: at, values: v})
		}
		return out
	}
	for _, tc := range []struct {
		leak    float64
		growing bool
	}{{0, false}, {40, true}} {
		rec := &Report{Name: "soak"}
		judgeSoak(series(tc.leak), 10*time.Minute, 2000, rec)
		if got := len(rec.problems) > 0; got != tc.growing {
			t.Errorf("heap leaking %v MiB/h: judged growing %v (%v), want %v", tc.leak, got, rec.problems, tc.growing)
		}
		if !strings.Contains(rec.Line(), "heap_mib_slope_2se=") {
			t.Errorf("the slope's interval is not reported: %s", rec.Line())
		}
	}
}
