package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ChromiumPath finds Debian's chromium (KFPIPE_CHROMIUM overrides); under
// CI a missing browser fails the test, elsewhere it skips.
func ChromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KFPIPE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	missing(t, "chromium (apt-get install -y chromium, or set KFPIPE_CHROMIUM)", exec.ErrNotFound)
	return ""
}

// Browser starts headless chromium for t, ended at cleanup or after
// timeout, and returns its chromedp context.
func Browser(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	chromium := ChromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
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
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(s string, a ...any) { t.Logf("chromedp: "+s, a...) }))
	t.Cleanup(func() { cancelBrowser(); cancelAlloc(); cancel() })
	return bctx
}

// PollJS waits (up to within) until the JavaScript expression expr is
// true in the browser; on timeout it fails t with the page's text. It
// calls t.Fatal, so only the test's goroutine may call it: elsewhere (a
// chaos scenario's fault) use WaitJS.
func PollJS(t testing.TB, bctx context.Context, what, expr string, within time.Duration) {
	t.Helper()
	if err := WaitJS(bctx, what, expr, within); err != nil {
		t.Fatal(err)
	}
}

// WaitJS waits (up to within) until the JavaScript expression expr is
// true in the browser; on timeout its error has the page's text.
func WaitJS(bctx context.Context, what, expr string, within time.Duration) error {
	ok, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(within), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil || !ok {
		text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
		return fmt.Errorf("%s: waiting for %s: %v\npage text:\n%s", what, expr, err, strings.TrimSpace(text))
	}
	return nil
}
