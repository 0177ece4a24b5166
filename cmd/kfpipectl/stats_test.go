package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestStats: kfpipectl stats asks WeChat (the fake) for every account's
// last days and prints today's counts; without credentials it says which
// variables to set; a range over 30 days is refused.
func TestStats(t *testing.T) {
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk-stats-a", "wk-stats-b"}})
	defer fake.Close()
	fake.AddText("wk-stats-a", "u1", "hi")
	fake.AddText("wk-stats-a", "u2", "hello")
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.TransServiceState(context.Background(), "wk-stats-a", "u1", kf.StateServicer, "alice"); err != nil {
		t.Fatal(err)
	}
	c := ctl{t: t, env: map[string]string{"KFPIPE_WECOM_BASE_URL": fake.URL(), "KFPIPE_WECOM_CORP_ID": fake.CorpID(),
		"KFPIPE_WECOM_SECRET": fake.Secret()}}
	out := c.must(0, "stats", "--days", "3").out
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1+2*3 {
		t.Fatalf("%d lines, want a header and 3 days of 2 accounts:\n%s", len(lines), out)
	}
	// Today's row of wk-stats-a (the last of its rows): 2 customers, 2
	// messages, 1 handed to a human.
	if !regexp.MustCompile(`(?m)^wk-stats-a\s+\S+\s+2\s+2\s+2\s+0\s+1\s*$`).MatchString(lines[3]) {
		t.Fatalf("today's row of wk-stats-a %q:\n%s", lines[3], out)
	}
	if r := c.run("stats", "--days", "31"); r.code == 0 || !strings.Contains(r.errOut, "--days") {
		t.Fatalf("31 days: exit %d, %s", r.code, r.errOut)
	}
	noCreds := ctl{t: t, env: map[string]string{"KFPIPE_WECOM_BASE_URL": fake.URL()}}
	if r := noCreds.run("stats"); r.code == 0 || !strings.Contains(r.errOut, "KFPIPE_WECOM_SECRET") {
		t.Fatalf("without credentials: exit %d, %s", r.code, r.errOut)
	}
}
