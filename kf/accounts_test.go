package kf_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/kf"
)

// TestAccountsServicersContactWay: accounts are added (with an uploaded
// avatar), listed, renamed and deleted; servicers added, listed and
// removed with a result per userid; a contact URL carries its scene.
func TestAccountsServicersContactWay(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	if _, err := c.AddAccount(ctx, "Support", "not-uploaded"); code(err) != kf.CodeInvalidMediaID {
		t.Fatalf("add with an avatar never uploaded: %v, want 40007", err)
	}
	avatar, err := c.UploadMedia(ctx, kf.MediaImage, "a.png", []byte("png"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.AddAccount(ctx, "Support", avatar)
	if err != nil || id == "" {
		t.Fatalf("add: %q %v", id, err)
	}
	if err := c.UpdateAccount(ctx, id, "After-sales", ""); err != nil {
		t.Fatal(err)
	}
	accts, err := c.Accounts(ctx)
	if err != nil || len(accts) != 2 {
		t.Fatalf("accounts %+v %v, want wk1 and the new one", accts, err)
	}
	var found bool
	for _, a := range accts {
		found = found || (a.OpenKfID == id && a.Name == "After-sales" && a.Avatar != "")
	}
	if !found {
		t.Fatalf("accounts %+v: the new account renamed is missing", accts)
	}
	url, err := c.ContactWay(ctx, id, "ad_spring")
	if err != nil || !strings.Contains(url, "ad_spring") {
		t.Fatalf("contact way %q %v", url, err)
	}
	if _, err := c.ContactWay(ctx, id, "bad scene!"); err == nil {
		t.Fatal("a scene with a space was accepted")
	}
	res, err := c.AddServicers(ctx, id, []string{"alice", "bob"})
	if err != nil || len(res) != 2 || res[0].Code != 0 {
		t.Fatalf("add servicers %+v %v", res, err)
	}
	res, err = c.DeleteServicers(ctx, id, []string{"bob", "carol"})
	if err != nil || len(res) != 2 || res[0].Code != 0 || res[1].Code == 0 {
		t.Fatalf("delete servicers %+v %v: bob removed, carol (never a servicer) refused", res, err)
	}
	svs, err := c.Servicers(ctx, id)
	if err != nil || len(svs) != 1 || svs[0].UserID != "alice" {
		t.Fatalf("servicers %+v %v", svs, err)
	}
	if _, err := c.AddServicers(ctx, id, nil); err == nil {
		t.Fatal("no userids accepted")
	}
	if err := c.DeleteAccount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Servicers(ctx, id); code(err) != kf.CodeInvalidOpenKfID {
		t.Fatalf("servicers of a deleted account: %v, want 95000", err)
	}
	fake.RemoveAccount("wk1")
	if accts, err := c.Accounts(ctx); err != nil || len(accts) != 0 {
		t.Fatalf("accounts after removing both: %+v %v", accts, err)
	}
}

// TestStatistics: one entry per day; the day's customers, messages and
// hand-offs are counted; ranges over 30 days or ending before they start
// are refused before the call.
func TestStatistics(t *testing.T) {
	fake, c, clk := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u1", "hi")
	fake.AddText("wk1", "u1", "again")
	fake.AddText("wk1", "u2", "hello")
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "bot"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TransServiceState(ctx, "wk1", "u1", kf.StateServicer, "alice"); err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	days, err := c.CorpStatistics(ctx, "wk1", now.Add(-6*24*time.Hour), now)
	if err != nil || len(days) < 7 {
		t.Fatalf("%d days, %v", len(days), err)
	}
	today := days[len(days)-1]
	if today.CustomerCount != 2 || today.CustomerMsgCount != 3 || today.AISessionReplyCount != 1 || today.UpgradeServiceCount != 1 {
		t.Fatalf("today %+v", today)
	}
	sv, err := c.ServicerStatistics(ctx, "wk1", "alice", now.Add(-24*time.Hour), now)
	if err != nil || sv[len(sv)-1].SessionCount != 1 {
		t.Fatalf("alice %+v %v", sv, err)
	}
	if _, err := c.CorpStatistics(ctx, "wk1", now.Add(-31*24*time.Hour), now); err == nil {
		t.Fatal("31 days accepted")
	}
	if _, err := c.CorpStatistics(ctx, "wk1", now, now.Add(-time.Hour)); err == nil {
		t.Fatal("a range ending before it starts accepted")
	}
}
