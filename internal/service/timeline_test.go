package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// answerer answers every message with one text reply (exactly once, as
// kfpipe.Reply does); tl-flaky's message fails its first 3 attempts so it
// goes through the DLQ and comes back.
type answerer struct {
	mu       sync.Mutex
	attempts map[string]int
	done     map[string]bool
}

func (a *answerer) Handle(ctx context.Context, m *chatmsg.ChatMessage) error {
	a.mu.Lock()
	a.attempts[m.UpstreamMsgID]++
	n := a.attempts[m.UpstreamMsgID]
	a.mu.Unlock()
	if m.ExternalUserID == "tl-flaky" && n <= 3 {
		return errors.New("downstream hiccup")
	}
	msg := kf.Text{Content: "thanks"}
	err := reply.DoContent(ctx, "reply", msg, func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
		_, err := kc.Send(ctx, to.OpenKfID, to.User, msgID, msg)
		return err
	})
	if err == nil {
		a.mu.Lock()
		a.done[m.UpstreamMsgID] = true
		a.mu.Unlock()
	}
	return err
}

// TestCustomerTimelineOnRunningPipeline runs the three daemons in one
// process on the real broker and Redis with replies to the fake WeChat,
// and reads the timeline of three customers — one answered, one
// dead-lettered then recovered, one the rate limiter blocked — and of a
// made-up user, who must not look like a quiet customer.
func TestCustomerTimelineOnRunningPipeline(t *testing.T) {
	pc := newPlace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// kfpipectl, built while the pipeline runs, reads the same timelines.
	type built struct {
		path string
		err  error
	}
	ctlc := make(chan built, 1)
	go func() {
		out := filepath.Join(t.TempDir(), "kfpipectl")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/kfpipectl")
		cmd.Dir = testenv.RepoRoot(t)
		b, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, b)
		}
		ctlc <- built{out, err}
	}()
	const wk = "wk-tl"
	fake := wecomtest.New(wecomtest.Options{CorpID: "ww-test-corp", Secret: "test-secret", Accounts: []string{wk}})
	defer fake.Close()

	pcfg := pc.producerConfig(t, fake, wk)
	ccfg := pc.consumerConfig(t)
	ccfg.RateLimit.DefaultGroup = "seed" // 5 in 10 s, blocked after 3 refusals
	ccfg.WeCom.BaseURL, ccfg.WeCom.CorpID, ccfg.WeCom.Secret = fake.URL(), "ww-test-corp", "test-secret"

	dcfg := pc.dlqConfig(t)
	dcfg.RateLimit.DefaultGroup = "seed"

	pl := startAnswering(t, ctx, pcfg, ccfg, dcfg)
	d := pl.d

	answered := fake.AddText(wk, "tl-answered", "where is my order?")
	flaky := fake.AddText(wk, "tl-flaky", "first try fails")
	for i := range 12 {
		fake.AddText(wk, "tl-flooder", fmt.Sprintf("spam %d", i))
	}
	resp, err := callbackSender(pl, pcfg).SendEvent(ctx, wk, fake.IssueToken(wk))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	viewer := dcfg.Admin.Tokens[1].Token
	timeline := func(user string) console.Timeline {
		t.Helper()
		code, b := adminGet(t, d.AdminURL+"/admin/customers/"+user+"/timeline", viewer)
		var tl console.Timeline
		if code != 200 || json.Unmarshal(b, &tl) != nil {
			t.Fatalf("timeline of %s: %d %s", user, code, b)
		}
		return tl
	}
	var last console.Timeline
	defer func() {
		if t.Failed() {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Logf("last timeline read: %s", b)
		}
	}()
	// wait reads user's timeline until ok holds of it.
	wait := func(user, what string, ok func(tl console.Timeline) bool) console.Timeline {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, func() error {
			last = timeline(user)
			return testenv.Check(ok(last), "%s", user+": "+what)
		})
		return last
	}

	tl := wait("tl-answered", "answered", func(tl console.Timeline) bool {
		return len(tl.Messages) == 1 && tl.Messages[0].Outcome == console.OutcomeAnswered
	})
	m := tl.Messages[0]
	if m.UpstreamMsgID != answered || len(m.Received) != 1 || m.Received[0].Partition != tl.Topic.Partition ||
		len(m.Replies) != 1 || m.Replies[0].MsgID == "" || m.Processed != console.DoneYes || m.Limiter != "admitted" ||
		len(m.Letters) != 0 || !tl.Known || !strings.Contains(tl.Summary, "1 answered") {
		t.Errorf("answered customer's timeline: %+v", tl)
	}

	// The letter is retried, and done once the DLQ's settling (every
	// 10 s) finds its message's mark: either is the recovered story. The
	// index learns of the retry after the re-injection, so the retried
	// message can be answered before its letter leaves due (a loaded run
	// read "due" here): the wait includes the letter's state.
	tl = wait("tl-flaky", "dead-lettered, then answered and its letter retried or done", func(tl console.Timeline) bool {
		if len(tl.Messages) != 1 || tl.Messages[0].Outcome != console.OutcomeAnswered || len(tl.Messages[0].Letters) == 0 {
			return false
		}
		s := tl.Messages[0].Letters[0].State
		return s == "retried" || s == "done"
	})
	m = tl.Messages[0]
	if m.UpstreamMsgID != flaky || len(m.Received) != 2 || !m.Received[1].RetryFromDLQ || m.Attempts != 2 ||
		m.Letters[0].Reason != "downstream_error" || (m.Letters[0].State != "retried" && m.Letters[0].State != "done") ||
		!strings.Contains(m.Story, "dead letter") || !strings.Contains(m.Story, "re-delivered 1 time(s)") {
		t.Errorf("recovered customer's timeline: %+v", m)
	}

	tl = wait("tl-flooder", "blocked, refusals in the DLQ", func(tl console.Timeline) bool {
		refused := 0
		for _, m := range tl.Messages {
			if m.Limiter == "refused" {
				refused++
			}
		}
		return len(tl.Messages) == 12 && refused == 7 && tl.Limiter != nil && tl.Limiter.Blocked
	})
	answeredN := 0
	for _, m := range tl.Messages {
		if m.Outcome == console.OutcomeAnswered {
			answeredN++
		}
		if m.Limiter == "refused" && (m.Outcome == console.OutcomeAnswered || len(m.Letters) == 0) {
			t.Errorf("a refused message: %+v", m)
		}
	}
	if answeredN != 5 || !strings.Contains(tl.Summary, "blocked by the rate limiter now") ||
		!strings.Contains(tl.Messages[0].Story, "refused by the rate limiter") {
		t.Errorf("blocked customer's timeline: %d answered, summary %q, newest %q", answeredN, tl.Summary, tl.Messages[0].Story)
	}

	// The rate-limit card tells how the block began: automatic, its
	// violations, the refusal's letter.
	code, b := adminGet(t, d.AdminURL+"/admin/ratelimit/status/tl-flooder", viewer)
	var card console.RateLimitCard
	if code != 200 || json.Unmarshal(b, &card) != nil {
		t.Fatalf("rate-limit status: %d %s", code, b)
	}
	if cur := card.BlockStory.Current; !card.Blocked || cur == nil || cur.Kind != "automatic" || cur.Letter == "" ||
		!strings.Contains(cur.Why, "3 consecutive violations") {
		_, letters := adminGet(t, d.AdminURL+"/admin/dlq/messages?user=tl-flooder", viewer)
		t.Errorf("the flooder's block story: %+v; letters %s", card.BlockStory, letters)
	}
	// The Kafka around the pipeline: both topics with their in-sync
	// replicas and groups, and the recovered customer's two records.
	code, b = adminGet(t, d.AdminURL+"/admin/kafka", viewer)
	var kc console.KafkaContext
	if code != 200 || json.Unmarshal(b, &kc) != nil || len(kc.Brokers) == 0 || len(kc.Topics) != 2 {
		t.Fatalf("kafka: %d %s", code, b)
	}
	for _, kt := range kc.Topics {
		if kt.Error != "" || len(kt.Partitions) == 0 || len(kt.Partitions[0].ISR) == 0 || kt.Group == "" {
			t.Errorf("kafka topic %s: %+v", kt.Role, kt)
		}
	}
	code, b = adminGet(t, d.AdminURL+"/admin/kafka/records?user=tl-flaky", viewer)
	var page console.RecordPage
	if code != 200 || json.Unmarshal(b, &page) != nil || len(page.Records) != 2 || !page.Records[0].RetryFromDLQ ||
		page.Records[1].UpstreamMsgID != flaky || len(page.Records[1].Message) == 0 || page.Records[0].Partition != page.Partition {
		t.Errorf("records of tl-flaky: %d %s", code, b)
	}
	code, b = adminGet(t, d.AdminURL+"/admin/kafka/records?msgid="+answered, viewer)
	if code != 200 || json.Unmarshal(b, &page) != nil || len(page.Records) != 1 || page.Records[0].Key != "tl-answered" {
		t.Errorf("records of msgid %s: %d %s", answered, code, b)
	}
	// The verdict answers every area; the DLQ holds the flooder's refusals.
	code, b = adminGet(t, d.AdminURL+"/admin/verdict", viewer)
	var v console.Verdict
	if code != 200 || json.Unmarshal(b, &v) != nil || len(v.Areas) != 5 {
		t.Fatalf("verdict: %d %s", code, b)
	}
	for _, a := range v.Areas {
		if a.State == console.StateUnknown && a.Area != "ingestion" {
			t.Errorf("verdict area %s unknown: %s", a.Area, a.Detail)
		}
	}

	tl = timeline("tl-nobody")
	if tl.Known || len(tl.Messages) != 0 || !strings.HasPrefix(tl.Summary, "nothing known about user tl-nobody") ||
		tl.Sources["main_topic"] != "ok" || tl.Sources["dedup"] != "" {
		t.Errorf("made-up user's timeline: %+v", tl)
	}
	// One message by its msgid.
	code, b = adminGet(t, d.AdminURL+"/admin/customers/tl-flaky/timeline?msgid="+flaky, viewer)
	if code != 200 || !strings.Contains(string(b), flaky) {
		t.Errorf("by msgid: %d %s", code, b)
	}
	// The same three customers from kfpipectl customer, as on-call reads
	// them in a terminal: the summary and every message's outcome and story.
	ctl := <-ctlc
	if ctl.err != nil {
		t.Fatalf("build kfpipectl: %v", ctl.err)
	}
	for _, user := range []string{"tl-answered", "tl-flaky", "tl-flooder"} {
		want := timeline(user)
		cmd := exec.CommandContext(ctx, ctl.path, "customer", user)
		cmd.Env = append(os.Environ(), "KFPIPE_ADMIN_URL="+d.AdminURL, "KFPIPE_TOKEN="+viewer)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kfpipectl customer %s: %v\n%s", user, err, out)
		}
		text := string(out)
		lines := []string{"customer " + user + "\n" + want.Summary + "\n"}
		for _, m := range want.Messages {
			lines = append(lines, strings.ToUpper(strings.ReplaceAll(m.Outcome, "_", " "))+"  "+m.UpstreamMsgID,
				"  story: "+m.Story+"\n")
		}
		for _, l := range lines {
			if !strings.Contains(text, l) {
				t.Errorf("kfpipectl customer %s lacks %q of the API's timeline:\n%s", user, l, text)
			}
		}
		if n := strings.Count(text, "\n  story: "); n != len(want.Messages) {
			t.Errorf("kfpipectl customer %s: %d messages, the API %d", user, n, len(want.Messages))
		}
	}
	if t.Failed() || testing.Short() {
		return
	}

	// The same journey in the console, as on-call walks it.
	bctx := testenv.Browser(t, time.Minute)
	poll := func(what, expr string) { t.Helper(); testenv.PollJS(t, bctx, what, expr, 15*time.Second) }
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("log in", chromedp.Navigate(d.AdminURL+"/admin/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), viewer), chromedp.Click(chromedp.CSS("#login-btn")),
		chromedp.WaitVisible(chromedp.CSS("#app")))
	search := func(user string) {
		t.Helper()
		// Submitted from the page: the overview above refreshes and moves
		// the form while a click would be on its way.
		do("search "+user, chromedp.Evaluate[chromedp.Void](`document.querySelector('#cu-user').value = ''`),
			chromedp.SendKeys(chromedp.CSS("#cu-user"), user),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#cu-form').requestSubmit()`))
	}
	rows := `document.querySelectorAll('#cu-messages tbody tr')`
	search("tl-answered")
	poll("answered customer in the console", fmt.Sprintf(`(() => { const r = %s; return r.length === 1 && r[0].dataset.msgid === %q
		&& r[0].dataset.outcome === "answered" && r[0].querySelector('td:nth-child(7)').textContent === "1 sent"; })()`, rows, answered))
	search("tl-flaky")
	poll("recovered customer in the console", fmt.Sprintf(`(() => { const r = %s; return r.length === 1 && r[0].dataset.msgid === %q
		&& r[0].dataset.outcome === "answered" && /^downstream_error: (retried|done)$/.test(r[0].querySelector('.letter-btn')?.textContent ?? "")
		&& r[0].querySelector('.story').textContent.includes("re-delivered 1 time(s) from the DLQ"); })()`, rows, flaky))
	shot, err := chromedp.Run(bctx, chromedp.Screenshot(chromedp.CSS("#customer-card")))
	if err != nil || !strings.HasPrefix(string(shot), "\x89PNG") {
		t.Fatalf("screenshot of the customer page: %v", err)
	}
	// docs/customer.png with KFPIPE_UPDATE_SCREENSHOT=1.
	dir := os.Getenv("KFPIPE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	png := filepath.Join(dir, "customer.png")
	if os.Getenv("KFPIPE_UPDATE_SCREENSHOT") == "1" {
		png = filepath.Join(testenv.RepoRoot(t), "docs", "customer.png")
	}
	if err := os.MkdirAll(filepath.Dir(png), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("customer page screenshot: %s", png)
	search("tl-flooder")
	poll("blocked customer in the console", fmt.Sprintf(`(() => { const r = [...%s];
		return r.length === 12 && r.filter((x) => x.querySelector('td:nth-child(4)')?.textContent === "refused").length === 7
			&& document.querySelector('#cu-limiter').textContent.includes("BLOCKED until"); })()`, rows))
	// The blocked customer's rate-limit card, the health and Kafka cards.
	do("rate-limit card of tl-flooder", chromedp.Evaluate[chromedp.Void](`document.querySelector('#rl-user').value = 'tl-flooder'`),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#rl-form').requestSubmit()`))
	poll("block story in the console", `document.querySelector('#rl-status tr[data-key="Block began"] td:nth-child(2)')?.textContent?.includes("automatic (rate limiter): 3 consecutive violations")`)
	poll("health and kafka cards", `document.querySelectorAll('#hv-areas .area').length === 5
		&& document.querySelectorAll('#kc-topics tr[data-topic="dlq"]').length > 0
		&& document.querySelector('#kc-error')?.textContent === ""`)
	search("tl-nobody")
	poll("made-up user in the console", `document.querySelector('#cu-summary').dataset.known === "false"
		&& document.querySelector('#cu-summary').textContent.startsWith("nothing known about user tl-nobody")`)
}

// startAnswering starts the pipeline with the answerer (a reply to each
// customer's message, the second try of tl-flaky's) behind the reply
// wrapper; the pipeline and then the reply sender stop at the test's end.
func startAnswering(t *testing.T, ctx context.Context, pcfg *config.Producer, ccfg *config.Consumer, dcfg *config.DLQConsumer) pipeline {
	t.Helper()
	ans := &answerer{attempts: map[string]int{}, done: map[string]bool{}}
	pl := startPipeline(t, ctx, pcfg, ccfg, dcfg, func(cbase *daemon.Base) handler.Handler {
		fx, closeReplies, err := reply.FromConfig(ctx, ccfg, cbase)
		if err != nil || fx == nil {
			t.Fatalf("replies: %v", err)
		}
		t.Cleanup(closeReplies)
		return reply.Wrap(ans, fx)
	})
	t.Cleanup(func() { pl.close(t) })
	return pl
}
