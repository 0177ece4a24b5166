package kfpipe_test

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestSimulatorInBrowser chats with examples/faqbot through the chat
// simulator as a developer would: the bot's own binary with --simulate
// (embedded Kafka and Redis), its page in headless chromium. Typed as the
// customer, "hours" gets the bot's answer, "menu" its menu, whose
// "Shipping" item, tapped, gets that answer; typed as a servicer, a
// message is handled and gets no reply.
func TestSimulatorInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with cgo")
	}
	bctx := testenv.Browser(t, 2*time.Minute)
	bin := filepath.Join(t.TempDir(), "faqbot")
	build := exec.Command("go", "build", "-o", bin, "./faqbot")
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the examples module: %v\n%s", err, out)
	}
	url := startSimulator(t, bin, "--simulate=127.0.0.1:0")

	const hours = "We are open 9:00-18:00, Monday to Saturday."
	if err := chromedp.Do(bctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS("#text")),
		chromedp.SetValue(chromedp.CSS("#user"), "browser-user"),
		chromedp.SendKeys(chromedp.CSS("#text"), "hours"),
		chromedp.Click(chromedp.CSS("#send")),
	); err != nil {
		t.Fatal(err)
	}
	bots := `document.querySelectorAll('#log .msg[data-from=bot]')`
	testenv.PollJS(t, bctx, "the customer's question", bots+`.length === 1 && `+bots+`[0].innerText.includes("`+hours+`")`, 60*time.Second)
	testenv.PollJS(t, bctx, "the session state", `/^[0-4] /.test(document.querySelector('#session').innerText)`, 5*time.Second)

	if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS("#text"), "menu"), chromedp.Click(chromedp.CSS("#send"))); err != nil {
		t.Fatal(err)
	}
	tap := `document.querySelector('#log button.tap[data-id=shipping]')`
	testenv.PollJS(t, bctx, "the menu", tap+` !== null`, 30*time.Second)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](tap+`.click(), true`)); err != nil {
		t.Fatal(err)
	}
	const shipping = "Orders ship within 24 hours; delivery takes 2-3 days."
	testenv.PollJS(t, bctx, "the tapped item's answer", bots+`.length === 3 && `+bots+`[2].innerText.includes("`+shipping+`")`, 30*time.Second)

	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#as-servicer")),
		chromedp.SendKeys(chromedp.CSS("#text"), "Hi, I am Alice from support"),
		chromedp.Click(chromedp.CSS("#send")),
	); err != nil {
		t.Fatal(err)
	}
	// Handled: the handler has run for it; a reply would be in by then.
	servicer := `document.querySelector('#log .msg[data-from=servicer]')`
	testenv.PollJS(t, bctx, "the servicer's message handled", servicer+` && `+servicer+`.innerText.includes("handled")`, 60*time.Second)
	n, err := chromedp.Run(bctx, chromedp.Evaluate[int](bots+`.length`))
	if err != nil || n != 3 {
		t.Fatalf("bot messages after the servicer's: %d (%v), want still 3", n, err)
	}
}

// startSimulator runs bin with args until the test ends and returns the
// page's URL, which it prints.
func startSimulator(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir() // outside the repository, as a bot's module is
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop within 15 s of SIGINT", bin)
			<-done
		}
	})
	urls := make(chan string, 1)
	go func() {
		defer close(done)
		re := regexp.MustCompile(`chat with your bot at (http://\S+/)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			} else {
				t.Logf("%s: %s", filepath.Base(bin), sc.Text())
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case u := <-urls:
		return u
	case <-done:
		t.Fatalf("%s %v exited without serving the page", bin, args)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s %v: no page URL within 60 s", bin, args)
	}
	return ""
}
