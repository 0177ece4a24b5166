package console

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/obs"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsoleHealthKafkaAndBlocks drives the console's on-call pages in
// headless chromium: the nav stays hidden before login; the Health card
// colours each area by the alert rules' bounds (lag past the warning: amber;
// a downstream gate open: red) and draws the history's sparklines; the
// Kafka card lists both topics with their in-sync replicas and browses a
// user's records; the rate-limit card says how a block began (automatic,
// its violations) and an operator's unblock answers next to its button.
// Every query is null-safe (?.): an expression that throws inside
// chromedp.Poll never settles it, and the poll waits out the browser.
func TestConsoleHealthKafkaAndBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	lag := int64(bound(t, "KfpipeConsumerLagHigh") + 1)
	src := &memKafka{memPipeline: memPipeline{
		accounts:  []AccountSync{{OpenKfID: "wk-sales", Reported: t0}},
		lag:       []PartitionLag{{Partition: 0, End: 100 + lag, Committed: 100, Lag: lag}},
		consumers: []ConsumerStatus{{Node: "c1", Reported: t0}, {Node: "c2", Reported: t0, OutageGateOpen: true}},
	}}
	f := newFixtureWith(t, src)
	f.dlq.mu.Lock()
	f.dlq.msgs = append(f.dlq.msgs, &DLQMessage{ID: "r9", User: "auto1", Reason: "rate_limited", State: "retried",
		FailureTime: t0.Add(-5 * time.Minute), Details: "group normal: 3 consecutive violations: blocked until 2025-03-01T12:55:00Z"})
	f.dlq.mu.Unlock()
	f.rl.block["auto1"] = 55 * time.Minute
	for i := range 5 {
		src.setLag([]PartitionLag{{Partition: 0, End: 100 + lag + int64(600*i), Committed: 100 + int64(500*i), Lag: lag + int64(100*i)}}, nil)
		if err := f.srv.watch.sampleHistory(context.Background(), t0.Add(time.Duration(i-5)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}

	bctx := testenv.Browser(t, 2*time.Minute)
	poll := func(what, expr string) { t.Helper(); testenv.PollJS(t, bctx, what, expr, 10*time.Second) }
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("open the console", chromedp.Navigate(f.http.URL+"/admin/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	poll("nav hidden before login", `document.querySelector('#nav')?.hidden === true && getComputedStyle(document.querySelector('#nav')).display === "none"`)
	do("log in", consoleLogin(f.http.URL, operatorToken)...)

	poll("health verdict", fmt.Sprintf(`document.querySelector('#hv-state')?.dataset.state === "red" && document.querySelector('#hv-state').textContent.startsWith("red since ")
		&& document.querySelector('[data-area=%q]')?.dataset.state === "amber"
		&& document.querySelector('[data-area=%q]')?.dataset.state === "red"
		&& document.querySelector('[data-area=%q] [data-item="c2"]')?.textContent.includes("gate open")
		&& document.querySelector('[data-area=%q]')?.title.includes("KfpipeConsumerLagCritical")`,
		obs.AreaLag, obs.AreaDownstream, obs.AreaDownstream, obs.AreaLag))
	poll("sparklines", `document.querySelectorAll('#hv-sparks figure').length === 4
		&& document.querySelector('#hv-sparks figure[data-series="Consumer lag"] path') !== null
		&& document.querySelector('#hv-sparks figure[data-series="In (produced)"] figcaption')?.textContent === "In (produced): 10.0/s"`)
	poll("kafka topics", `document.querySelectorAll('#kc-topics tr[data-topic="main"]').length === 1
		&& document.querySelector('#kc-topics tr[data-topic="main"] td:nth-child(5)')?.textContent === "1"
		&& document.querySelector('#kc-brokers')?.textContent === "1 b1:9092"
		&& document.querySelector('#kc-topics tbody')?.textContent.includes("timed out")`)
	do("browse a user's records", chromedp.SendKeys(chromedp.CSS("#kb-user"), "u7"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#kb-form')?.requestSubmit()`))
	poll("browsed", `document.querySelectorAll('#kb-records tbody tr').length === 1
		&& document.querySelector('#kb-note')?.textContent.startsWith("m partition 3")`)
	if src.got.User != "u7" {
		t.Errorf("browse asked for %+v", src.got)
	}

	do("look up a blocked user", chromedp.SendKeys(chromedp.CSS("#rl-user"), "auto1"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#rl-form')?.requestSubmit()`))
	poll("block story", `document.querySelector('#rl-status tr[data-key="Block began"] td:nth-child(2)')?.textContent.includes("automatic (rate limiter): 3 consecutive violations")
		&& document.querySelector('#rl-blocks tr[data-kind="automatic"] td:nth-child(5)')?.textContent === "dead letter r9"`)
	do("unblock with a reason", chromedp.Click(chromedp.CSS("#rl-unblock")), chromedp.WaitVisible(chromedp.CSS("#reason-text")),
		chromedp.SendKeys(chromedp.CSS("#reason-text"), "customer apologised"), chromedp.Click(chromedp.CSS("#reason-ok")))
	poll("feedback next to the button", `document.querySelector('#rl-unblock + .feedback')?.textContent === "Unblock auto1: done"
		&& document.querySelector('#rl-blocks tr[data-action="unblock"] td:nth-child(3)')?.textContent === "alice"`)
}
