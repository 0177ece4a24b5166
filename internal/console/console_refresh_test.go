package console

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestConsoleRefreshesDespiteAFailingCard: a card whose load fails at
// login (here the rate limiter's store is down: the blocked list and the
// overview answer 503) no longer leaves the page without its 10 s refresh:
// the health verdict turns red on its own when the lag passes the critical
// rule's bound.
func TestConsoleRefreshesDespiteAFailingCard(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	src := &memKafka{memPipeline: memPipeline{accounts: []AccountSync{{OpenKfID: "wk", Reported: t0}},
		lag: []PartitionLag{}, consumers: []ConsumerStatus{{Node: "c1", Reported: t0}}}}
	f := newFixtureWith(t, src)
	f.rl.mu.Lock()
	f.rl.fail = errStoreDown
	f.rl.mu.Unlock()
	bctx := testenv.Browser(t, time.Minute)
	if err := chromedp.Do(bctx, consoleLogin(f.http.URL, operatorToken)...); err != nil {
		t.Fatal(err)
	}
	testenv.PollJS(t, bctx, "green", `document.querySelector('#hv-state')?.dataset.state === "green"`, 10*time.Second)
	critical := int64(bound(t, "KfpipeConsumerLagCritical") + 1)
	src.setLag([]PartitionLag{{Partition: 0, End: critical, Committed: 0, Lag: critical}}, nil)
	testenv.PollJS(t, bctx, "red at the next refresh", `document.querySelector('#hv-state')?.dataset.state === "red" && document.querySelector('#hv-state').textContent.startsWith("red since ")`, 25*time.Second)
}
