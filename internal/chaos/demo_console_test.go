package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/demo"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestDemoConsoleFirstLook is the README's first experience, checked in
// headless chromium: `make demo --hold` (the short scenario, embedded
// Kafka and Redis, with the bot writing as long as in the full one, so the
// DLQ's hour passes its amber bound), then the console as an on-call
// person opens it:
//   - the excited customer, whose 24 messages all succeeded, has a complete
//     timeline (every message answered, the whole window read);
//   - a made-up id says nothing is known about it, and its page differs
//     from the real customer's;
//   - the health verdict says since when it holds its state: "amber
//     since …" for the DLQ's growth, and the whole verdict too (the
//     embedded Redis is not "unknown");
//   - a retry batch of the bot's paced letters (more than the DLQ's
//     per-user pace lets back in one window) is estimated by its dry run
//     within 20% of the time it takes until its last letter is back in
//     the main topic (full run only: it takes one pacing window, 60 s).
func TestDemoConsoleFirstLook(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo and a browser")
	}
	bctx := testenv.Browser(t, 4*time.Minute)
	adminURL, token := holdDemo(t)

	poll := func(what, expr string, within time.Duration) {
		t.Helper()
		testenv.PollJS(t, bctx, what, expr, within)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("log in", chromedp.Navigate(adminURL+"/admin/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-btn")),
		chromedp.WaitVisible(chromedp.CSS("#app")))

	// The verdict: amber (the bot's refusals are more than the DLQ's
	// hourly bound), with since when, and no area unknown.
	poll("the verdict amber since a time", `(() => { const v = document.querySelector('#hv-state');
		return v.dataset.state === "amber" && /^amber since \S+/.test(v.textContent); })()`, 30*time.Second)
	poll("the DLQ area amber since a time", `/^[^:]+: amber since \S+/.test(document.querySelector('#hv-areas [data-area=dlq] strong').textContent)`, 5*time.Second)
	poll("no area unknown", `[...document.querySelectorAll('#hv-areas [data-area]')].every((a) => a.dataset.state !== "unknown")`, 5*time.Second)

	search := func(user string) {
		t.Helper()
		do("search "+user, chromedp.Click(chromedp.CSS(`#nav a[href="#customer-card"]`)),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#cu-user').value = ''`),
			chromedp.SendKeys(chromedp.CSS("#cu-user"), user), chromedp.Click(chromedp.CSS("#cu-lookup")))
	}
	page := `JSON.stringify({summary: document.querySelector('#cu-summary').textContent,
		known: document.querySelector('#cu-summary').dataset.known, read: document.querySelector('#cu-read').textContent,
		rows: [...document.querySelectorAll('#cu-messages tbody tr')].map((r) => r.dataset.outcome || r.textContent)})`

	excited := demo.ShortScenario().Excited[0].N + demo.ShortScenario().Excited[1].N
	search("demo-excited")
	poll("the excited customer's complete timeline", fmt.Sprintf(`(() => { const rows = [...document.querySelectorAll('#cu-messages tbody tr')];
		return document.querySelector('#cu-summary').dataset.known === "true" && rows.length === %d
			&& rows.every((r) => r.dataset.outcome === "answered")
			&& document.querySelector('#cu-summary').textContent.includes("%d answered")
			&& document.querySelector('#cu-read').textContent.includes("the whole window read"); })()`, excited, excited), 20*time.Second)
	known, err := chromedp.Run(bctx, chromedp.Evaluate[string](page))
	if err != nil {
		t.Fatal(err)
	}

	search("wmNOBODY123")
	poll("the made-up id unknown", `document.querySelector('#cu-summary').dataset.known === "false"
		&& document.querySelector('#cu-summary').textContent.startsWith("nothing known about user wmNOBODY123")
		&& document.querySelector('#cu-messages tbody').textContent === "nothing known about this user"`, 20*time.Second)
	unknown, err := chromedp.Run(bctx, chromedp.Evaluate[string](page))
	if err != nil {
		t.Fatal(err)
	}
	var a, b struct {
		Summary, Known string
		Rows           []string
	}
	if json.Unmarshal([]byte(known), &a) != nil || json.Unmarshal([]byte(unknown), &b) != nil ||
		a.Summary == b.Summary || a.Known == b.Known || len(a.Rows) == len(b.Rows) {
		t.Fatalf("the answered customer's page and the made-up id's do not differ:\n%s\n%s", known, unknown)
	}
	t.Logf("demo-excited: %s", a.Summary)
	t.Logf("wmNOBODY123: %s", b.Summary)

	if !Full() {
		t.Logf("the batch's time against its dry run: full run only (%s=1), it takes one pacing window", EnvFull)
		return
	}
	timeBotRetry(t, bctx, adminURL, token)
}

// timeBotRetry retries the blocked bot's letters from the console (one
// more than the DLQ's per-user pace lets back in a window, unblocking the
// bot first) and checks the dry run's time against the batch's: from its
// start to its last letter back in the main topic.
func timeBotRetry(t *testing.T, bctx context.Context, adminURL, token string) {
	t.Helper()
	// A first look gives the DLQ's per-user pace.
	var look console.BatchPlan
	if err := apiJSON(adminURL, token, "POST", "/admin/dlq/batch-retry", map[string]any{"filter": map[string]any{"user": "demo-bot"},
		"unblock": true, "dry_run": true, "reason": "test: dry run"}, &look); err != nil {
		t.Fatal(err)
	}
	if look.Pace == nil || look.Count <= look.Pace.Allow {
		t.Fatalf("the bot's letters %+v: want more than one pacing window's (pace %+v)", look, look.Pace)
	}
	n := look.Pace.Allow + 1
	filter := map[string]any{"user": "demo-bot", "limit": n}

	// The letters go back to the consumer's limiter, which judges a
	// rate_limited letter again: while the bot's own burst still fills its
	// window there, the first ones are refused again and come back a
	// window later, ahead of the batch's last (each user's letters in
	// order). The dry run estimates the batch's own pacing, so the batch
	// starts once the bot's last answered message is a window old.
	var tl struct {
		Messages []struct {
			Outcome  string `json:"outcome"`
			Received []struct {
				Time time.Time `json:"time"`
			} `json:"received"`
		} `json:"messages"`
	}
	if err := apiJSON(adminURL, token, "GET", "/admin/customers/demo-bot/timeline", nil, &tl); err != nil {
		t.Fatal(err)
	}
	var lastAnswered time.Time
	for _, m := range tl.Messages {
		if m.Outcome == "answered" && len(m.Received) > 0 && m.Received[0].Time.After(lastAnswered) {
			lastAnswered = m.Received[0].Time
		}
	}
	if lastAnswered.IsZero() {
		t.Fatalf("the bot's timeline has no answered message: %+v", tl)
	}
	window := time.Duration(look.Pace.WindowSeconds * float64(time.Second))
	if wait := time.Until(lastAnswered.Add(window + time.Second)); wait > 0 {
		t.Logf("waiting %s for the bot's last answered message (%s) to leave the limiter's window", wait.Round(time.Second), lastAnswered.Format(time.TimeOnly))
		time.Sleep(wait)
	}
	var dry console.BatchPlan
	if err := apiJSON(adminURL, token, "POST", "/admin/dlq/batch-retry",
		map[string]any{"filter": filter, "unblock": true, "dry_run": true, "reason": "test: dry run"}, &dry); err != nil {
		t.Fatal(err)
	}
	if dry.Count != n || dry.Pace == nil || dry.Pace.PacedUsers != 1 {
		t.Fatalf("dry run of %d bot letters: %+v (pace %+v)", n, dry, dry.Pace)
	}
	t.Logf("dry run: %d letters, about %.0f s (%d a user every %.0f s)", dry.Count, dry.Seconds, dry.Pace.Allow, dry.Pace.WindowSeconds)

	var started console.BatchPlan
	start := time.Now()
	if err := apiJSON(adminURL, token, "POST", "/admin/dlq/batch-retry",
		map[string]any{"filter": filter, "unblock": true, "reason": "test: bot fixed"}, &started); err != nil {
		t.Fatal(err)
	}
	if started.Batch == nil || started.Batch.Total != n {
		t.Fatalf("batch: %+v", started)
	}
	id := started.Batch.ID
	row := fmt.Sprintf(`document.querySelector('#batches tbody tr[data-id="%s"]')`, id)
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#nav a[href="#batches-card"]`)),
		chromedp.Click(chromedp.CSS("#refresh-batches"))); err != nil {
		t.Fatal(err)
	}
	// While the last letter waits for the bot's next window, the batch
	// says so: not done, n-1 delivered, the next retry's time.
	testenv.PollJS(t, bctx, "the batch waiting for its paced letter", fmt.Sprintf(`(() => { const r = %s;
		return r !== null && r.dataset.state === "running" && r.querySelector('.delivered').textContent.startsWith("%d/%d")
			&& r.querySelector('.next-retry').textContent !== ""; })()`, row, n-1, n), 30*time.Second)
	var b console.Batch
	seen := ""
	deadline := start.Add(time.Duration(2*dry.Seconds)*time.Second + 30*time.Second)
	for {
		if err := apiJSON(adminURL, token, "GET", "/admin/dlq/batches/"+id, nil, &b); err != nil {
			t.Fatal(err)
		}
		if b.State != console.BatchRunning {
			break
		}
		if now := fmt.Sprintf("%d/%d requeued, %d back, %d waiting, next %v", b.Position, b.Total, b.Delivered, b.Waiting, b.NextRetry); now != seen {
			t.Logf("%5.1f s: %s", time.Since(start).Seconds(), now)
			seen = now
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch still running %s after its start: %+v", time.Since(start).Round(time.Second), b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start).Seconds()
	if b.State != console.BatchDone || b.Delivered != n || b.Waiting != 0 {
		t.Fatalf("batch ended %+v, want done with all %d delivered", b, n)
	}
	t.Logf("batch %s: %d letters delivered in %.1f s; the dry run said %.0f s", id, b.Delivered, took, dry.Seconds)
	if took < 0.8*dry.Seconds || took > 1.2*dry.Seconds {
		t.Fatalf("the batch took %.1f s, its dry run said %.0f s: more than 20%% apart", took, dry.Seconds)
	}
	testenv.PollJS(t, bctx, "the batch done in the console", fmt.Sprintf(`(() => { const r = %s;
		return r !== null && r.dataset.state === "done" && r.querySelector('.delivered').textContent.startsWith("%d/%d"); })()`, row, n, n), 10*time.Second)
}

// holdDemo runs the demo's short scenario with --hold in this process
// until the test ends, and returns its console's URL and operator token
// once it holds. The bot writes for 4 s, as in the full scenario.
func holdDemo(t *testing.T) (adminURL, token string) {
	t.Helper()
	sc := demo.ShortScenario()
	sc.BotFor = 4 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	out := &lockedBuffer{b: &bytes.Buffer{}}
	done, read := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := demo.Run(ctx, demo.Options{Scenario: sc, Seed: 1, Hold: true, Out: out, Notice: pw,
			DrainTimeout: 45 * time.Second})
		_ = pw.CloseWithError(fmt.Errorf("demo ended: %v", err))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("demo: %v", err)
			}
			<-read
		case <-time.After(30 * time.Second):
			t.Errorf("the demo did not stop within 30 s of its end")
		}
	})
	holding := regexp.MustCompile(`^holding: admin console (http://\S+)/admin/ui/ \(token (\S+)\)`)
	found := make(chan [2]string, 1)
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := holding.FindStringSubmatch(sc.Text()); m != nil {
				found <- [2]string{m[1], m[2]}
			} else {
				t.Logf("demo: %s", sc.Text())
			}
		}
	}()
	select {
	case f := <-found:
		t.Logf("the demo's report:\n%s", out.String())
		return f[0], f[1]
	case err := <-done:
		t.Fatalf("the demo ended before holding: %v\n%s", err, out.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the demo did not hold within 2 min\n%s", out.String())
	}
	return "", ""
}

// lockedBuffer is a bytes.Buffer written by the demo and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// apiJSON calls the admin API with token and decodes its JSON answer.
func apiJSON(adminURL, token, method, path string, body, v any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, adminURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return json.Unmarshal(data, v)
}
