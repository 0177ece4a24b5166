package console

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsoleCustomerTimeline walks "customer X says the bot never
// answered" in headless chromium: search each of the three customers and
// read their story from the timeline table — answered, dead-lettered then
// recovered (its letter opens the dead-letter detail), blocked with its
// refusal in the DLQ — then a made-up id, which says "nothing known".
func TestConsoleCustomerTimeline(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	f := timelineFixture(t)
	bctx := testenv.Browser(t, 50*time.Second)
	poll := func(what, expr string) { t.Helper(); testenv.PollJS(t, bctx, what, expr, 10*time.Second) }
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	search := func(user string) {
		t.Helper()
		do("search "+user,
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#cu-user').value = ''`),
			chromedp.SendKeys(chromedp.CSS("#cu-user"), user),
			chromedp.Click(chromedp.CSS("#cu-lookup")),
		)
	}
	do("open console and log in", consoleLogin(f.http.URL, viewerToken)...)
	do("customer page from the nav", chromedp.Click(chromedp.CSS(`#nav a[href="#customer-card"]`)))

	search("cust-ok")
	poll("answered customer", `(() => { const rows = document.querySelectorAll('#cu-messages tbody tr');
		return rows.length === 2 && rows[0].dataset.msgid === "ok-new" && rows[0].dataset.outcome === "answered"
			&& rows[0].querySelector('td:nth-child(7)').textContent === "2 sent"
			&& rows[0].querySelector('.story').textContent.includes("partition 2 offset 20")
			&& document.querySelector('#cu-summary').dataset.known === "true"; })()`)

	search("cust-rec")
	poll("recovered customer", `(() => { const rows = document.querySelectorAll('#cu-messages tbody tr');
		return rows.length === 1 && rows[0].dataset.msgid === "rec-1" && rows[0].dataset.outcome === "processed"
			&& rows[0].querySelector('td:nth-child(3)').textContent === "p2@30, p2@40 (retry 1)"
			&& rows[0].querySelector('td:nth-child(6)').textContent === "2"
			&& rows[0].querySelector('.story').textContent.includes("dead letter L-rec (downstream_error)"); })()`)
	do("open its letter", chromedp.Click(chromedp.CSS(`#cu-messages tr[data-msgid="rec-1"] .letter-btn`)))
	poll("letter detail", `!document.querySelector('#detail').hidden && document.querySelector('#detail-id').textContent === "L-rec"`)

	search("cust-blk")
	poll("blocked customer", `(() => { const rows = document.querySelectorAll('#cu-messages tbody tr');
		return rows.length === 1 && rows[0].dataset.outcome === "dead_letter"
			&& rows[0].querySelector('td:nth-child(4)').textContent === "refused"
			&& document.querySelector('#cu-limiter').textContent.includes("BLOCKED until")
			&& document.querySelector('#cu-events tbody tr').dataset.kind === "block"; })()`)

	search("nobody-at-all")
	poll("made-up user", `document.querySelector('#cu-summary').dataset.known === "false"
		&& document.querySelector('#cu-summary').textContent.startsWith("nothing known about user nobody-at-all")
		&& document.querySelector('#cu-messages tbody').textContent === "nothing known about this user"`)

	do("bad window", chromedp.Evaluate[chromedp.Void](`document.querySelector('#cu-window').value = 'soon'`))
	search("cust-ok")
	poll("error next to the form", `document.querySelector('#cu-error').textContent.includes("(window)")`)
}
