package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsoleOverviewOfRunningPipeline opens the admin console in headless
// chromium on a running pipeline (the three daemons as processes, the fake
// WeChat, messages flowing) and reads its overview as on-call would: every
// WeChat account with a recent successful sync and its 72-hour horizon
// state, one row per main-topic partition with the schedule-consumers'
// lag, and a throughput in and out above zero between two refreshes. The
// screenshot is docs/console.png (written there with
// KFPIPE_UPDATE_SCREENSHOT=1, else to KFPIPE_ARTIFACTS or a temp dir).
func TestConsoleOverviewOfRunningPipeline(t *testing.T) {
	svc := NeedServices(t)
	bctx := testenv.Browser(t, 3*time.Minute)
	// A bot the rate limiter blocks gives the DLQ chart something to show.
	limited := map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": "normal"}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1, SinkSleep: time.Millisecond,
		ConsumerEnv: limited, DLQEnv: limited})
	Run(t, "console-overview", p, Load{Total: 3000, Users: 200, Rate: 100, BotPerMin: 600}, time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		poll := func(what, expr string, within time.Duration) error { return testenv.WaitJS(bctx, what, expr, within) }
		if err := consoleLogin(bctx, p.AdminURL); err != nil {
			return err
		}
		// kf-producer publishes every 10 s; the console refreshes every 10 s.
		var accounts []string
		for _, kf := range p.OpenKfIDs {
			accounts = append(accounts, fmt.Sprintf(`document.querySelector('#accounts tr[data-kf="%s"] td:nth-child(2)')?.textContent === "ok"
				&& document.querySelector('#accounts tr[data-kf="%s"] td:nth-child(3)')?.textContent.endsWith(" ago")`, kf, kf))
		}
		if err := poll("every account synced, horizon ok", strings.Join(accounts, " && "), 45*time.Second); err != nil {
			return err
		}
		if err := poll("one row per partition with the lag", fmt.Sprintf(`document.querySelectorAll('#partitions tbody tr').length === %d
			&& /^[0-9]+$/.test(document.querySelector('#ov-lag').textContent)
			&& document.querySelector('#ov-lag-error').textContent === ""`, p.Opts.Partitions), 30*time.Second); err != nil {
			return err
		}
		if err := poll("the dead letters of the last hour charted", `parseInt(document.querySelector('#ov-inflow').textContent) > 0
			&& document.querySelectorAll('#inflow-chart svg rect').length > 0`, 30*time.Second); err != nil {
			return err
		}
		if err := poll("throughput in and out between two refreshes", `(() => { const m = document.querySelector('#ov-rate').textContent.match(/^([0-9.]+) \/ ([0-9.]+)$/);
			return m !== null && parseFloat(m[1]) > 0 && parseFloat(m[2]) > 0; })()`, 30*time.Second); err != nil {
			return err
		}
		// The on-call cards: the verdict of every area, both topics with
		// their in-sync replicas.
		if err := poll("the health verdict and the Kafka card", `document.querySelectorAll('#hv-areas .area').length === 5
			&& ["green", "amber", "red", "unknown"].includes(document.querySelector('#hv-state')?.dataset.state)
			&& document.querySelectorAll('#kc-topics tr[data-topic="main"]').length > 0
			&& document.querySelectorAll('#kc-topics tr[data-topic="dlq"]').length > 0`, 30*time.Second); err != nil {
			return err
		}
		if lag, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS("#ov-lag"))); err == nil {
			rec.Extra("overview_lag", lag)
		}
		if rate, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS("#ov-rate"))); err == nil {
			rec.Extra("overview_in_out", strings.ReplaceAll(rate, " ", ""))
		}
		shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			return fmt.Errorf("screenshot: %w", err)
		}
		if !strings.HasPrefix(string(shot), "\x89PNG") {
			rec.Problem("the screenshot is not a PNG")
		}
		dir := os.Getenv("KFPIPE_ARTIFACTS")
		if dir == "" {
			dir = t.TempDir()
		}
		path := filepath.Join(dir, "console.png")
		if os.Getenv("KFPIPE_UPDATE_SCREENSHOT") == "1" {
			path = filepath.Join(testenv.RepoRoot(t), "docs", "console.png")
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		t.Logf("console screenshot: %s", path)
		return os.WriteFile(path, shot, 0o644)
	})
}

// TestConsoleFleetSeesAKilledDaemonLeave: the three daemons run as
// processes with coord enabled (the shared etcd, a 3 s lease); the
// console's fleet page shows all three with what they work on (the
// producer's worker ID, the consumer's partitions, the dlq-consumer's admin
// address), and after the consumer is killed with SIGKILL — no chance to
// unregister — it is listed stale when its lease expires (and dropped
// fleet.GoneAfter after it was last heard from).
func TestConsoleFleetSeesAKilledDaemonLeave(t *testing.T) {
	svc := NeedServices(t)
	etcd := strings.Join(testenv.EtcdEndpoints(t), ",")
	bctx := testenv.Browser(t, 3*time.Minute)
	const lease = 3 * time.Second
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1, SinkSleep: time.Millisecond,
		Env: map[string]string{"KFPIPE_COORD_ENABLED": "true", "KFPIPE_COORD_ENDPOINTS": etcd,
			"KFPIPE_COORD_KEEP_ALIVE": lease.String(), "KFPIPE_COORD_NAMESPACE": "/" + testenv.Name(t, "fleet") + "/"}})
	poll := func(what, expr string, within time.Duration) { t.Helper(); testenv.PollJS(t, bctx, what, expr, within) }
	if err := consoleLogin(bctx, p.AdminURL); err != nil {
		t.Fatal(err)
	}
	row := func(role string) string {
		return fmt.Sprintf(`document.querySelector('#fleet tr[data-role="%s"] td:nth-child(7)')?.textContent`, role)
	}
	parts := make([]string, p.Opts.Partitions)
	for i := range parts {
		parts[i] = strconv.Itoa(i)
	}
	poll("the three daemons with what they work on", fmt.Sprintf(`document.querySelectorAll('#fleet tbody tr').length === 3
		&& /^worker ID [0-9]+$/.test(%s)
		&& /^partitions %s; [0-9]+ actors$/.test(%s)
		&& /^admin 127\.0\.0\.1:[0-9]+$/.test(%s)`, row("kf-producer"), strings.Join(parts, ", "), row("schedule-consumer"), row("dlq-consumer")), 30*time.Second)
	victim := p.Consumers[0]
	if _, err := victim.Kill9(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The fleet's rule (fleet.Judge, as for the consumers table): a daemon
	// whose lease expired is listed stale, then dropped GoneAfter after it
	// was last heard from — not at once, and not as a running one.
	var stale console.FleetList
	for {
		stale = console.FleetList{} // a decode into the last answer would keep its by_role keys
		if err := getJSON(p.AdminURL+"/admin/fleet", &stale); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range stale.Members {
			if m.Role == "schedule-consumer" && m.Stale && m.LastHeard != nil {
				n++
			}
		}
		if n == 1 && len(stale.Members) == 3 {
			break
		}
		if time.Since(killed) > lease+20*time.Second {
			t.Fatalf("the killed consumer is not listed stale %s after the kill: %+v", time.Since(killed), stale.Members)
		}
		time.Sleep(200 * time.Millisecond)
	}
	gone := time.Since(killed)
	poll("the killed consumer's row is listed stale, not running", `document.querySelectorAll('#fleet tbody tr').length === 3
		&& document.querySelector('#fleet tr[data-role="schedule-consumer"]')?.dataset.stale === "true"
		&& /^silent since /.test(`+row("schedule-consumer")+`)`, 10*time.Second)
	if stale.ByRole["schedule-consumer"] != 0 {
		t.Fatalf("the stale consumer is counted as running: by_role %v", stale.ByRole)
	}
	t.Logf("scenario=console-fleet daemons=3 killed=schedule-consumer lease=%s stale_after=%s", lease, gone.Round(100*time.Millisecond))
	if gone < time.Second {
		t.Fatalf("the killed consumer turned stale after %s: before its lease could expire, so not by its lease", gone)
	}
}

// getJSON GETs url with the operator token and decodes the answer into v.
func getJSON(url string, v any) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// consoleLogin opens the console at adminURL and logs in with the
// operator token.
func consoleLogin(bctx context.Context, adminURL string) error {
	if err := chromedp.Do(bctx,
		chromedp.Navigate(adminURL+"/admin/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), OperatorToken),
		chromedp.Click(chromedp.CSS("#login-btn")),
		chromedp.WaitVisible(chromedp.CSS("#app")),
	); err != nil {
		return fmt.Errorf("log in: %w", err)
	}
	return nil
}
