package console

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsoleInBrowser drives the console in headless chromium over the
// DevTools protocol as an operator would: read the overview, log in,
// filter by user, open a message, retry it with a reason, unblock a user,
// and checks that the writes reached the stores and the audit stream.
func TestConsoleInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	var week []AccountDay // the statistics kf-producer collected: 7 days
	for i := range 7 {
		week = append(week, AccountDay{Day: t0.AddDate(0, 0, i-6), Sessions: i, Customers: i, CustomerMessages: 10 * i, HandedOn: 1})
	}
	f := newFixtureWith(t, &memPipeline{
		accounts: []AccountSync{
			{OpenKfID: "wk-sales", LastSuccess: at(-3 * time.Second), Reported: t0, Days: week},
			{OpenKfID: "wk-support", LastSuccess: at(-50 * time.Hour), OldestWaiting: at(-50 * time.Hour), Reported: t0},
		},
		lag: []PartitionLag{{Partition: 0, End: 120, Committed: 100, Lag: 20}, {Partition: 1, End: 80, Committed: 80}},
	})
	bctx := testenv.Browser(t, 50*time.Second)
	poll := func(what, expr string) { t.Helper(); testenv.PollJS(t, bctx, what, expr, 10*time.Second) }
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	do("open console and log in", consoleLogin(f.http.URL, operatorToken)...)
	// The overview: the account 50 h behind is critical with 22 h left,
	// the lag is summed, the chart has the last hour's reasons.
	poll("overview accounts", `document.querySelector('#accounts tr[data-kf="wk-support"] td:nth-child(2)')?.textContent === "critical"
		&& document.querySelector('#accounts tr[data-kf="wk-support"] td:nth-child(5)')?.textContent === "22.0 h"
		&& document.querySelector('#accounts tr[data-kf="wk-sales"] td:nth-child(2)')?.textContent === "ok"`)
	// Each account's last 7 days: customer messages per day, and the
	// sums of messages, customers and sessions.
	poll("overview statistics", `document.querySelector('#accounts tr[data-kf="wk-sales"] td:nth-child(6)')?.textContent === "0 · 10 · 20 · 30 · 40 · 50 · 60 (210 / 21 / 21)"
		&& document.querySelector('#accounts tr[data-kf="wk-support"] td:nth-child(6)')?.textContent === "not collected yet"`)
	poll("overview lag", `document.querySelector('#ov-lag').textContent === "20" && document.querySelectorAll('#partitions tbody tr').length === 2`)
	poll("overview inflow", `document.querySelector('#ov-inflow').textContent === "3"
		&& document.querySelectorAll('#inflow-chart svg rect').length === 3
		&& document.querySelector('#inflow-chart .legend [data-reason="downstream_error"]') !== null`)
	poll("stats by reason", `document.querySelector('#stats tr[data-reason="rate_limited"] td:nth-child(2)')?.textContent === "2"`)
	poll("all messages listed", `document.querySelectorAll('#messages tbody tr').length === 4`)
	if tok, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`sessionStorage.getItem("kfpipe-admin-token")`)); tok != operatorToken {
		t.Errorf("token not kept in sessionStorage: %q", tok)
	}

	do("filter by user",
		chromedp.SendKeys(chromedp.CSS("#f-user"), "u2"),
		chromedp.Click(chromedp.CSS("#f-apply")),
	)
	poll("filtered table", `(() => { const rows = document.querySelectorAll('#messages tbody tr');
		return rows.length === 1 && rows[0].dataset.id === "m2"; })()`)

	do("open detail", chromedp.Click(chromedp.CSS(`#messages tr[data-id="m2"] .detail-btn`)), chromedp.WaitVisible(chromedp.CSS("#detail")))
	poll("detail view", `document.querySelector('#detail-body').textContent.includes('"id": "m2"')`)

	do("retry with a reason",
		chromedp.Click(chromedp.CSS(`#messages tr[data-id="m2"] .retry-btn`)),
		chromedp.WaitVisible(chromedp.CSS("#reason-text")),
		chromedp.SendKeys(chromedp.CSS("#reason-text"), "retried from the browser test"),
		chromedp.Click(chromedp.CSS("#reason-ok")),
	)
	poll("retry confirmed", `document.querySelector('#status').textContent.includes("Retry scheduled for m2")`)
	poll("row shows due", `document.querySelector('#messages tr[data-id="m2"] td:nth-child(4)')?.textContent === "due"`)
	if got := f.dlq.retriedIDs(); !slices.Equal(got, []string{"m2"}) {
		t.Errorf("store retried %v, want [m2]", got)
	}

	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("KFPIPE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "admin-console.png")
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshot: %s (%d bytes)", png, len(shot))
	if !strings.HasPrefix(string(shot), "\x89PNG") {
		t.Errorf("screenshot is not a PNG")
	}

	do("unblock a user",
		chromedp.WaitVisible(chromedp.CSS(`#blocked tr[data-user="bad1"] .unblock-btn`)),
		chromedp.Click(chromedp.CSS(`#blocked tr[data-user="bad1"] .unblock-btn`)),
		chromedp.WaitVisible(chromedp.CSS("#reason-text")),
		chromedp.SendKeys(chromedp.CSS("#reason-text"), "appeal accepted"),
		chromedp.Click(chromedp.CSS("#reason-ok")),
	)
	poll("unblocked row gone", `document.querySelector('#blocked tr[data-user="bad1"]') === null && document.querySelectorAll('#blocked tbody tr').length === 1`)

	var got []string
	for _, e := range f.auditEntries(t) {
		got = append(got, e["who"].(string)+" "+e["action"].(string)+" "+e["target"].(string)+" "+e["reason"].(string))
	}
	want := []string{"alice dlq.retry dlq:m2 retried from the browser test", "alice ratelimit.unblock user:bad1 appeal accepted"}
	if !slices.Equal(got, want) {
		t.Errorf("audit %q, want %q", got, want)
	}
}

// TestConsoleBatchRetryAndViewer: in the browser, an operator's "Retry all
// matching" shows the dry run (letters, users, already done) before asking
// for the reason; the batch then retries exactly the dry run's count, its
// progress ends "done" in the Batches card; the grouped view, the rate-limit
// lookup and the filtered audit log show what they should. A viewer then
// sees no write control at all, and the API refuses the viewer's write
// from the same page anyway.
func TestConsoleBatchRetryAndViewer(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	d := reviewLetters(120)
	for i := 0; i < 120; i += 10 {
		d.done[fmt.Sprintf("m%04d", i)] = true
	}
	f := batchFixture(t, d, 200, "")
	f.rl.block["bad2"] = time.Hour
	bctx := testenv.Browser(t, 60*time.Second)
	poll := func(what, expr string) { t.Helper(); testenv.PollJS(t, bctx, what, expr, 15*time.Second) }
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	login := func(token string) { t.Helper(); do("log in", consoleLogin(f.http.URL, token)...) }
	login(operatorToken)
	poll("operator identity", `document.querySelector('#whoami').textContent === "alice (operator)"`)
	do("select the letters in review",
		chromedp.SetValue(chromedp.CSS("#f-review"), "true"),
		chromedp.Click(chromedp.CSS("#f-apply")),
		chromedp.Click(chromedp.CSS("#groups summary")),
	)
	// u0's twelve letters are all done (every tenth): they are counted
	// apart, so nine users are listed.
	poll("grouped by user", `document.querySelectorAll('#groups-user tbody tr').length === 9
		&& document.querySelector('#groups-summary').textContent.includes("12 more matched but their message is done already")
		&& document.querySelector('#groups-user tr[data-user="u3"] td:nth-child(2)')?.textContent === "12"
		&& document.querySelector('#groups-reason tr[data-reason="downstream_error"] td:nth-child(2)')?.textContent === "108"`)
	do("retry all matching: the dry run first", chromedp.Click(chromedp.CSS("#batch-retry")), chromedp.WaitVisible(chromedp.CSS("#dry-run")))
	count, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#dry-run p').dataset.count`))
	if err != nil || count != "108" {
		t.Fatalf("dry run count %q (%v), want 108 (120 selected, 12 done)", count, err)
	}
	text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#dry-run').textContent`))
	// u0's letters are the done ones: 9 users have letters to retry.
	if !strings.Contains(text, "108 message(s) of 9 user(s)") || !strings.Contains(text, "12 more selected are done already") {
		t.Errorf("dry run says %q", text)
	}
	if n := len(d.retriedIDs()); n != 0 {
		t.Fatalf("the dry run retried %d letters", n)
	}
	do("confirm with a reason",
		chromedp.SendKeys(chromedp.CSS("#reason-text"), "downstream fixed"),
		chromedp.Click(chromedp.CSS("#reason-ok")),
	)
	poll("batch done with the dry run's count", `(() => { const r = document.querySelector('#batches tbody tr');
		return r && r.dataset.state === "done" && r.querySelector('.acted').textContent === "108"; })()`)
	if n := len(d.retriedIDs()); n != 108 {
		t.Errorf("store retried %d letters, the dry run said 108", n)
	}

	do("look up a user's rate limit",
		chromedp.SendKeys(chromedp.CSS("#rl-user"), "bad2"),
		chromedp.Click(chromedp.CSS("#rl-lookup")),
	)
	poll("rate-limit status", `document.querySelector('#rl-status tr[data-key="Blocked"] td:nth-child(2)')?.textContent.startsWith("until")`)
	do("filter the audit log",
		chromedp.SendKeys(chromedp.CSS("#a-action"), "dlq.batch_retry"),
		chromedp.Click(chromedp.CSS("#a-apply")),
	)
	poll("audit filtered", `(() => { const rows = [...document.querySelectorAll('#audit tbody tr')];
		return rows.length === 2 && rows.every((r) => r.children[2].textContent === "dlq.batch_retry")
			&& rows.some((r) => r.children[4].textContent === "downstream fixed"); })()`)

	// A viewer: no write control shown (there are many on the page), and
	// the API refuses a write sent from the page anyway.
	do("log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	login(viewerToken)
	poll("viewer identity", `document.querySelector('#whoami').textContent === "bob (viewer)"
		&& document.querySelectorAll('#messages tbody tr').length > 0 && document.querySelectorAll('#batches tbody tr').length > 0`)
	do("open the rate-limit lookup", chromedp.SendKeys(chromedp.CSS("#rl-user"), "bad2"), chromedp.Click(chromedp.CSS("#rl-lookup")))
	poll("viewer sees the lookup", `document.querySelector('#rl-result').hidden === false`)
	n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('.write').length`))
	if err != nil || n < 8 {
		t.Fatalf("%d write controls on the page (%v): the check would prove nothing", n, err)
	}
	visible, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('.write')]
		.filter((e) => e.offsetParent !== null || e.getClientRects().length > 0).map((e) => e.id || e.className)`))
	if err != nil || len(visible) != 0 {
		t.Errorf("write controls visible to a viewer: %v (%v)", visible, err)
	}
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/admin/dlq/batch-retry", {method: "POST",
		headers: {"Authorization": "Bearer " + sessionStorage.getItem("kfpipe-admin-token"), "Content-Type": "application/json"},
		body: JSON.stringify({filter: {all: true}, reason: "viewer tries"})}).then((r) => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != 403 {
		t.Errorf("viewer's batch retry from the page: %d (%v), want 403", status, err)
	}
}

// consoleLogin opens the console at base and logs in with token.
func consoleLogin(base, token string) []chromedp.Action[chromedp.Void] {
	return []chromedp.Action[chromedp.Void]{
		chromedp.Navigate(base + "/admin/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login-btn")),
		chromedp.WaitVisible(chromedp.CSS("#app")),
	}
}
