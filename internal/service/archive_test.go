package service

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// TestCustomerTimelineFromArchive runs the three daemons with the
// conversation archive on the real broker, Redis and PostgreSQL. The main
// topic is pre-filled with a customer's message five days old followed by
// more records on its partition than the timeline's max_records: the topic
// scan cannot reach it, the archive answers with it. The running
// pipeline's three customers (answered, dead-lettered then recovered,
// blocked) have complete timelines from the archive through the API and
// kfpipectl; a made-up user is "nothing known" (exit 3); and every
// message on the main topic is archived exactly once.
func TestCustomerTimelineFromArchive(t *testing.T) {
	pc := newPlace(t)
	dsn := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ctlPath := filepath.Join(t.TempDir(), "kfpipectl")
	built := make(chan error, 1)
	go func() {
		cmd := exec.Command("go", "build", "-o", ctlPath, "./cmd/kfpipectl")
		cmd.Dir = testenv.RepoRoot(t)
		if b, err := cmd.CombinedOutput(); err != nil {
			built <- fmt.Errorf("%w: %s", err, b)
			return
		}
		built <- nil
	}()
	const wk = "wk-arch"
	fake := wecomtest.New(wecomtest.Options{CorpID: "ww-test-corp", Secret: "test-secret", Accounts: []string{wk}})
	defer fake.Close()
	pcfg := pc.producerConfig(t, fake, wk)
	ccfg := pc.consumerConfig(t)
	ccfg.RateLimit.DefaultGroup = "seed" // 5 in 10 s, blocked after 3 refusals
	ccfg.WeCom.BaseURL, ccfg.WeCom.CorpID, ccfg.WeCom.Secret = fake.URL(), "ww-test-corp", "test-secret"
	dcfg := pc.dlqConfig(t)
	dcfg.RateLimit.DefaultGroup = "seed"
	dcfg.Archive.DSN = dsn
	archiveOutcomes(t, pc, dsn, ccfg, dcfg)

	// The old message, then fillers on its partition (other users, 2 a
	// partition's max_records below).
	const maxRecords = 300
	parts := ccfg.Kafka.Topics.Main.Partitions
	testenv.CreateTopic(t, pc.mainTopic, parts)
	oldUser := "ar-old"
	p := kafkaclient.KeyPartition(oldUser, parts)
	old := &chatmsg.ChatMessage{MessageID: 1, UpstreamMsgID: "ar-old-msg", OpenKfID: wk, ExternalUserID: oldUser, MsgType: "text",
		Origin: 3, SendTime: time.Now().Add(-5 * 24 * time.Hour).Unix(), Content: json.RawMessage(`{"text":{"content":"my parcel from last week"}}`)}
	recs := []testenv.Record{record(t, old)}
	for i := 0; len(recs) < maxRecords+100; i++ {
		u := fmt.Sprintf("ar-filler-%d", i)
		if kafkaclient.KeyPartition(u, parts) != p {
			continue
		}
		recs = append(recs, record(t, &chatmsg.ChatMessage{MessageID: int64(i + 2), UpstreamMsgID: fmt.Sprintf("ar-fill-%d", i),
			OpenKfID: wk, ExternalUserID: u, MsgType: "text", Origin: 3, SendTime: time.Now().Unix(),
			Content: json.RawMessage(`{"text":{"content":"filler"}}`)}))
	}
	testenv.Produce(t, testenv.KafkaBrokers(t), pc.mainTopic, recs)

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
	timeline := func(user, query string) console.Timeline {
		t.Helper()
		code, b := adminGet(t, d.AdminURL+"/admin/customers/"+user+"/timeline?max_records="+fmt.Sprint(maxRecords)+query, viewer)
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
	wait := func(user, query, what string, ok func(tl console.Timeline) bool) console.Timeline {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, func() error {
			last = timeline(user, query)
			return testenv.Check(ok(last), "%s", user+": "+what)
		})
		return last
	}
	archived := func(tl console.Timeline) bool {
		for _, m := range tl.Messages {
			if len(m.Received) == 0 || !m.Received[0].Archived {
				return false
			}
		}
		return tl.Archive != nil && tl.Sources["archive"] == "ok" && tl.Archive.BehindBy == 0 && tl.Complete
	}

	tl := wait(oldUser, "&window=168h", "the 5-day-old message from the archive", func(tl console.Timeline) bool {
		return len(tl.Messages) == 1 && archived(tl)
	})
	if m := tl.Messages[0]; m.UpstreamMsgID != old.UpstreamMsgID || m.Preview != "my parcel from last week" ||
		!strings.Contains(tl.Summary, "the whole 168h0m0s window read from the archive") {
		t.Errorf("old customer's timeline: %+v", tl)
	}
	// The main topic alone cannot reach it with the same max_records.
	topicOnly := sources.NewPipeline(dcfg, sources.Deps{Kafka: testenv.Admin(t)})
	scan, err := topicOnly.UserRecords(ctx, oldUser, time.Now().Add(-168*time.Hour), maxRecords)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.Records) != 0 || !scan.Truncated {
		t.Fatalf("the topic scan reached the old message (%d records, truncated %v): the test proves nothing", len(scan.Records), scan.Truncated)
	}

	tl = wait("tl-answered", "", "answered, from the archive", func(tl console.Timeline) bool {
		return len(tl.Messages) == 1 && tl.Messages[0].Outcome == console.OutcomeAnswered && archived(tl)
	})
	if tl.Messages[0].UpstreamMsgID != answered || len(tl.Messages[0].Replies) != 1 {
		t.Errorf("answered customer's timeline: %+v", tl)
	}
	tl = wait("tl-flaky", "", "dead-lettered then answered, from the archive", func(tl console.Timeline) bool {
		return len(tl.Messages) == 1 && tl.Messages[0].Outcome == console.OutcomeAnswered && len(tl.Messages[0].Letters) == 1 && archived(tl)
	})
	if m := tl.Messages[0]; m.UpstreamMsgID != flaky || m.Letters[0].Reason != "downstream_error" {
		t.Errorf("recovered customer's timeline: %+v", m)
	}
	wait("tl-flooder", "", "blocked, 7 refused, from the archive", func(tl console.Timeline) bool {
		refused := 0
		for _, m := range tl.Messages {
			if m.Limiter == "refused" {
				refused++
			}
		}
		return len(tl.Messages) == 12 && refused == 7 && tl.Limiter != nil && tl.Limiter.Blocked && archived(tl)
	})
	tl = timeline("ar-nobody", "&window=168h")
	if tl.Known || !tl.Complete || !strings.HasPrefix(tl.Summary, "nothing known about user ar-nobody") {
		t.Errorf("made-up user's timeline: %+v", tl)
	}

	// kfpipectl reads the same: the old message, and not found for the
	// made-up user.
	if err := <-built; err != nil {
		t.Fatalf("build kfpipectl: %v", err)
	}
	ctl := func(args ...string) (string, int) {
		cmd := exec.CommandContext(ctx, ctlPath, append([]string{"customer"}, args...)...)
		cmd.Env = append(os.Environ(), "KFPIPE_ADMIN_URL="+d.AdminURL, "KFPIPE_TOKEN="+viewer)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	if out, code := ctl(oldUser, "--window", "168h", "--max-records", fmt.Sprint(maxRecords)); code != 0 ||
		!strings.Contains(out, old.UpstreamMsgID) || !strings.Contains(out, "the whole window") {
		t.Errorf("kfpipectl customer %s: exit %d\n%s", oldUser, code, out)
	}
	for _, u := range []string{"tl-answered", "tl-flaky", "tl-flooder"} {
		want := timeline(u, "")
		out, code := ctl(u, "--max-records", fmt.Sprint(maxRecords))
		if code != 0 || strings.Count(out, "\n  story: ") != len(want.Messages) {
			t.Errorf("kfpipectl customer %s: exit %d, want %d messages\n%s", u, code, len(want.Messages), out)
		}
	}
	if out, code := ctl("ar-nobody"); code != 3 || !strings.Contains(out, "nothing known about user ar-nobody") {
		t.Errorf("kfpipectl customer ar-nobody: exit %d, want 3\n%s", code, out)
	}

	// The console shows the same: the old message from the archive, the
	// whole window read; a made-up id is "nothing known".
	if !t.Failed() && !testing.Short() {
		bctx := testenv.Browser(t, time.Minute)
		if err := chromedp.Do(bctx, chromedp.Navigate(d.AdminURL+"/admin/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), viewer), chromedp.Click(chromedp.CSS("#login-btn")),
			chromedp.WaitVisible(chromedp.CSS("#app"))); err != nil {
			t.Fatalf("log in: %v", err)
		}
		search := func(user, window string) {
			t.Helper()
			if err := chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector('#cu-user').value = %q;
				document.querySelector('#cu-window').value = %q; document.querySelector('#cu-form').requestSubmit()`, user, window))); err != nil {
				t.Fatalf("search %s: %v", user, err)
			}
		}
		search(oldUser, "168h")
		testenv.PollJS(t, bctx, "the old message in the console", fmt.Sprintf(`(() => {
			const r = document.querySelectorAll('#cu-messages tbody tr');
			const read = document.querySelector('#cu-read').textContent;
			return r.length === 1 && r[0].dataset.msgid === %q && r[0].textContent.includes("(archive)")
				&& read.startsWith("archive: messages sent since") && read.includes("the whole window read"); })()`, old.UpstreamMsgID), 15*time.Second)
		search("ar-nobody", "168h")
		testenv.PollJS(t, bctx, "the made-up user in the console", `document.querySelector('#cu-summary').dataset.known === "false"
			&& document.querySelector('#cu-summary').textContent.startsWith("nothing known about user ar-nobody")`, 15*time.Second)
	}

	// Every main-topic message archived exactly once: one row per msgid,
	// and every message the test sent among them.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows, msgids int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT msgid) FROM kf_archive WHERE kind = 'message'`).Scan(&rows, &msgids); err != nil {
		t.Fatal(err)
	}
	if want := len(recs) + 14; rows != want || msgids != want {
		t.Errorf("archive holds %d message rows of %d msgids, want %d of %d", rows, msgids, want, want)
	}
	checkArchivedOutcomes(t, ctx, dsn, wk, answered, flaky)
}

func record(t *testing.T, m *chatmsg.ChatMessage) testenv.Record {
	t.Helper()
	v, err := chatmsg.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Record{Key: []byte(m.ExternalUserID), Value: v}
}
