package service

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// TestProducerDiscoversAccounts: with wecom.open_kfids empty kf-producer
// lists the corp's accounts at start; an account added in WeChat (the
// kf_account_auth_change callback) is synced within 10 s without a
// restart — its messages reach Kafka with no kf_msg_or_event for it — and
// one removed is no longer synced or triggered.
func TestProducerDiscoversAccounts(t *testing.T) {
	pc := newPlace(t)
	rdb, prefix := pc.rdb, pc.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const first, added = "wk-disc-first", "wk-disc-added"
	tp := pc.startTestProducer(t, ctx, first, func(cfg *config.Producer) {
		cfg.WeCom.OpenKfIDs = nil
		cfg.WeCom.DenyOpenKfIDs = []string{"wk-disc-denied"}
	})
	cfg, p, fake := tp.cfg, tp.p, tp.fake
	fake.AddAccount("wk-disc-denied")
	// The first listing may race the denied account's creation: a second
	// listing (the callback below) must drop it in any case.
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Check(slices.Contains(p.Syncer.Accounts(), first), "the account listed at start")
	})

	fake.AddAccount(added)
	fake.AddText(added, "wm-disc-1", "hello from a new account")
	sender := &wecomtest.CallbackSender{URL: p.CallbackURL, Token: cfg.Callback.Token,
		AESKey: cfg.Callback.EncodingAESKey, CorpID: cfg.WeCom.CorpID}
	start := time.Now()
	resp, err := sender.SendAccountAuthChange(ctx, []string{added}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Check(rdb.Get(ctx, prefix+"cursor:"+added).Val() == fake.LastCursor(added), "the new account's messages in Kafka (cursor advanced)")
	})
	t.Logf("new account synced %v after the auth change", time.Since(start).Round(time.Millisecond))
	if accts := p.Syncer.Accounts(); !slices.Equal(accts, []string{added, first}) {
		t.Fatalf("accounts %v, want %v (wk-disc-denied is denied)", accts, []string{added, first})
	}

	fake.RemoveAccount(added)
	resp, err = sender.SendAccountAuthChange(ctx, nil, []string{added})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Check(!slices.Contains(p.Syncer.Accounts(), added), "the removed account no longer synced")
	})
	if err := p.Syncer.Trigger(added, ""); !errors.Is(err, producer.ErrUnknownOpenKfID) {
		t.Fatalf("a trigger of the removed account: %v, want ErrUnknownOpenKfID", err)
	}
	calls := func() int {
		n := 0
		for _, c := range fake.SyncCalls() {
			if c.OpenKfID == added {
				n++
			}
		}
		return n
	}
	// A pass already running when the account was removed finishes; none
	// starts afterwards.
	time.Sleep(time.Second)
	before := calls()
	time.Sleep(2 * time.Second)
	if n := calls(); n != before {
		t.Fatalf("%d sync_msg calls for the removed account after its removal", n-before)
	}
}
