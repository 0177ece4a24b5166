package kfpipe_test

import (
	"bufio"
	"context"
	"os"
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
	openSimulator(t, bctx, url, "browser-user")
	sendInSimulator(t, bctx, false, "hours")
	testenv.PollJS(t, bctx, "the customer's question", botMsgs+`.length === 1 && `+botMsgs+`[0].innerText.includes("`+hours+`")`, 60*time.Second)
	testenv.PollJS(t, bctx, "the session state", `/^[0-4] /.test(document.querySelector('#session').innerText)`, 5*time.Second)

	sendInSimulator(t, bctx, false, "menu")
	tap := `document.querySelector('#log button.tap[data-id=shipping]')`
	testenv.PollJS(t, bctx, "the menu", tap+` !== null`, 30*time.Second)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](tap+`.click(), true`)); err != nil {
		t.Fatal(err)
	}
	const shipping = "Orders ship within 24 hours; delivery takes 2-3 days."
	testenv.PollJS(t, bctx, "the tapped item's answer", botMsgs+`.length === 3 && `+botMsgs+`[2].innerText.includes("`+shipping+`")`, 30*time.Second)

	sendInSimulator(t, bctx, true, "Hi, I am Alice from support")
	expectServicerHandledUnanswered(t, bctx, 3)
}

// TestSimulatorJourney is a customer's whole conversation on faqbot's
// --simulate page, in headless chromium: the customer uploads a photo from
// the page (served by the fake WeChat's media/get, kept in the media
// store) and the bot answers with its size; the customer asks for a human,
// the servicer answers (the bot does not), the servicer ends the session
// from the page, and the bot answers the customer again. Every entry on
// the page carries WeChat's time, and the page shows them in that order.
func TestSimulatorJourney(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with cgo")
	}
	bctx := testenv.Browser(t, 3*time.Minute)
	dir := t.TempDir()
	bin := filepath.Join(dir, "faqbot")
	build := exec.Command("go", "build", "-o", bin, "./faqbot")
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the examples module: %v\n%s", err, out)
	}
	photo := filepath.Join(dir, "parcel.jpg")
	if err := os.WriteFile(photo, append([]byte("\xff\xd8\xff\xe0\x00\x10JFIF"), make([]byte, 7000)...), 0o644); err != nil {
		t.Fatal(err)
	}
	url := startSimulator(t, bin, "--simulate=127.0.0.1:0")
	openSimulator(t, bctx, url, "journey-user")

	// 1. A photo, uploaded from the page: the bot answers with its size.
	if err := chromedp.Do(bctx, chromedp.SetUploadFiles(chromedp.CSS("#file"), []string{photo})); err != nil {
		t.Fatal(err)
	}
	testenv.PollJS(t, bctx, "the photo's size", botMsgs+`.length === 1 && `+botMsgs+`[0].innerText.includes("Thanks for the picture (7 KB).")`, 60*time.Second)
	testenv.PollJS(t, bctx, "the photo on the page", `document.querySelector('#log .msg[data-from=customer]').innerText.includes("[image] parcel.jpg, 7 KB")`, 5*time.Second)
	// WeChat's quota, as the fake keeps it: 5 after the customer's message, one used.
	testenv.PollJS(t, bctx, "the replies left", `document.querySelector('#quota').innerText.startsWith("4 replies left until ")`, 5*time.Second)

	// 2. A human: the bot says so and hands the session to servicer-1.
	sendInSimulator(t, bctx, false, "human")
	testenv.PollJS(t, bctx, "the hand-over", `document.querySelector('#session').innerText.startsWith("3 ")`, 30*time.Second)
	testenv.PollJS(t, bctx, "the bot's words and the transfer", botMsgs+`.length === 3 && `+botMsgs+`[1].innerText.includes("Connecting you to a person")`, 30*time.Second)

	// 3. The servicer answers; the bot stays out.
	sendInSimulator(t, bctx, true, "Hi, I am servicer-1. Let me look at your photo.")
	expectServicerHandledUnanswered(t, bctx, 3)

	// 4. The servicer ends the session; the bot answers the customer again.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#end"))); err != nil {
		t.Fatal(err)
	}
	testenv.PollJS(t, bctx, "the session ended", `document.querySelector('#session').innerText.startsWith("4 ")`, 30*time.Second)
	ended := `[...document.querySelectorAll('#log .msg[data-from=event]')].find((e) => e.innerText.includes("ends the session"))`
	testenv.PollJS(t, bctx, "the end's event handled", ended+` && `+ended+`.innerText.includes("handled")`, 60*time.Second)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#as-customer"))); err != nil {
		t.Fatal(err)
	}
	sendInSimulator(t, bctx, false, "hours")
	testenv.PollJS(t, bctx, "the bot again", botMsgs+`.length === 4 && `+botMsgs+`[3].innerText.includes("We are open 9:00-18:00")`, 60*time.Second)

	// Every entry has a time, and the page is in time order.
	order := `(() => { const at = [...document.querySelectorAll('#log .msg')].map((e) => e.dataset.at);
	  if (at.length < 8 || at.some((a) => !a || a.startsWith("0001"))) return "times: " + JSON.stringify(at);
	  for (let i = 1; i < at.length; i++) if (Date.parse(at[i]) < Date.parse(at[i-1])) return "out of order at " + i + ": " + JSON.stringify(at);
	  return ""; })()`
	if msg, err := chromedp.Run(bctx, chromedp.Evaluate[string](order)); err != nil || msg != "" {
		text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#log').innerText`))
		t.Fatalf("the page's entries: %s (%v)\n%s", msg, err, text)
	}
	text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#log').innerText`))
	t.Logf("the conversation:\n%s", text)
}

// botMsgs is the simulator page's bot messages (JavaScript).
const botMsgs = `document.querySelectorAll('#log .msg[data-from=bot]')`

// openSimulator opens the simulator's page at url and chats as user.
func openSimulator(t *testing.T, bctx context.Context, url, user string) {
	t.Helper()
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#text")),
		chromedp.SetValue(chromedp.CSS("#user"), user)); err != nil {
		t.Fatal(err)
	}
}

// sendInSimulator types text on the page and sends it, as the servicer
// (servicer true) or as the customer.
func sendInSimulator(t *testing.T, bctx context.Context, servicer bool, text string) {
	t.Helper()
	var acts []chromedp.Action[chromedp.Void]
	if servicer {
		acts = append(acts, chromedp.Click(chromedp.CSS("#as-servicer")))
	}
	acts = append(acts, chromedp.SendKeys(chromedp.CSS("#text"), text), chromedp.Click(chromedp.CSS("#send")))
	if err := chromedp.Do(bctx, acts...); err != nil {
		t.Fatal(err)
	}
}

// expectServicerHandledUnanswered waits until the servicer's message is
// handled (the handler has run for it: a reply would be in by then) and
// checks that the bot has still sent bots messages only.
func expectServicerHandledUnanswered(t *testing.T, bctx context.Context, bots int) {
	t.Helper()
	servicer := `document.querySelector('#log .msg[data-from=servicer]')`
	testenv.PollJS(t, bctx, "the servicer's message handled", servicer+` && `+servicer+`.innerText.includes("handled")`, 60*time.Second)
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](botMsgs+`.length`)); err != nil || n != bots {
		t.Fatalf("bot messages after the servicer's: %d (%v), want still %d: the bot answered a servicer", n, err, bots)
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
