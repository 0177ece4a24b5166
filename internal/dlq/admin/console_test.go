package admin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// chromiumPath finds Debian's chromium (KFPIPE_CHROMIUM overrides); under
// CI a missing browser fails the test, elsewhere it skips.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KFPIPE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found: apt-get install -y chromium (or set KFPIPE_CHROMIUM)"
	if testenv.InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestConsoleInBrowser drives the console in headless chromium over the
// DevTools protocol as an operator would: log in, filter by user, open a
// message, retry it with a reason, unblock a user, and checks that the
// writes reached the stores and the audit stream.
func TestConsoleInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	chromium := chromiumPath(t)
	f := newFixture(t)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1100),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(s string, a ...any) { t.Logf("chromedp: "+s, a...) }))
	defer cancelBrowser()

	poll := func(what, expr string) {
		t.Helper()
		ok, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(10*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
		if err != nil || !ok {
			status, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: waiting for %s: %v\npage text:\n%s", what, expr, err, status)
		}
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	do("open console and log in",
		chromedp.Navigate(f.http.URL+"/admin/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), operatorToken),
		chromedp.Click(chromedp.CSS("#login-btn")),
		chromedp.WaitVisible(chromedp.CSS("#app")),
	)
	poll("stats by reason", `document.querySelector('#stats tr[data-reason="rate_limited"] td:nth-child(2)')?.textContent === "2"`)
	poll("all messages listed", `document.querySelectorAll('#messages tbody tr').length === 4`)
	if tok, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`sessionStorage.getItem("kfpipe-admin-token")`)); tok != operatorToken {
		t.Errorf("token not kept in sessionStorage: %q", tok)
	}

	do("filter by user",
		chromedp.SendKeys(chromedp.CSS("#f-user"), "u3"),
		chromedp.Click(chromedp.CSS("#f-apply")),
	)
	poll("filtered table", `(() => { const rows = document.querySelectorAll('#messages tbody tr');
		return rows.length === 1 && rows[0].dataset.id === "m4"; })()`)

	do("open detail", chromedp.Click(chromedp.CSS(`#messages tr[data-id="m4"] .detail-btn`)), chromedp.WaitVisible(chromedp.CSS("#detail")))
	poll("detail view", `document.querySelector('#detail-body').textContent.includes('"id": "m4"')`)

	do("retry with a reason",
		chromedp.Click(chromedp.CSS(`#messages tr[data-id="m4"] .retry-btn`)),
		chromedp.WaitVisible(chromedp.CSS("#reason-text")),
		chromedp.SendKeys(chromedp.CSS("#reason-text"), "retried from the browser test"),
		chromedp.Click(chromedp.CSS("#reason-ok")),
	)
	poll("retry confirmed", `document.querySelector('#status').textContent.includes("Retry scheduled for m4")`)
	poll("row shows due", `document.querySelector('#messages tr[data-id="m4"] td:nth-child(4)')?.textContent === "due"`)
	if got := f.dlq.retriedIDs(); !slices.Equal(got, []string{"m4"}) {
		t.Errorf("store retried %v, want [m4]", got)
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
	want := []string{"alice dlq.retry dlq:m4 retried from the browser test", "alice ratelimit.unblock user:bad1 appeal accepted"}
	if !slices.Equal(got, want) {
		t.Errorf("audit %q, want %q", got, want)
	}
}
