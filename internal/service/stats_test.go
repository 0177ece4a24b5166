package service

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestAccountStatsInOverview: kf-producer's collector reads 7 days of
// get_corp_statistic per account from WeChat into Redis, and the admin
// overview's accounts (sources.Pipeline) carry them, the customers' messages
// of today on the last day.
func TestAccountStatsInOverview(t *testing.T) {
	mini := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	defer rdb.Close()
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk1", "wk2"}})
	defer fake.Close()
	fake.AddText("wk1", "u1", "hello")
	fake.AddText("wk1", "u1", "anyone?")
	fake.AddText("wk1", "u2", "hi")
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	const prefix = "kfpipe-test:"
	if err := collectStats(ctx, kc, rdb, prefix, []string{"wk1", "wk2", "wk-gone"}, now); err == nil {
		t.Fatal("collectStats with an unknown account: no error")
	}
	state := producer.NewRedisState(rdb, prefix)
	if err := state.WriteSyncStatus(ctx, []producer.SyncStatus{{OpenKfID: "wk1", LastSuccess: now, Reported: now},
		{OpenKfID: "wk2", Reported: now}}); err != nil {
		t.Fatal(err)
	}
	cfg := &config.DLQConsumer{}
	cfg.Redis.KeyPrefix = prefix
	accts, err := sources.NewPipeline(cfg, sources.Deps{Redis: rdb}).Accounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 2 || accts[0].OpenKfID != "wk1" {
		t.Fatalf("accounts %+v, want wk1 and wk2", accts)
	}
	for _, a := range accts {
		if len(a.Days) != StatsDays {
			t.Fatalf("%s: %d days, want %d: %+v", a.OpenKfID, len(a.Days), StatsDays, a.Days)
		}
		for i := 1; i < len(a.Days); i++ {
			if a.Days[i].Day.Sub(a.Days[i-1].Day) != 24*time.Hour {
				t.Fatalf("%s: day %d is %s after day %d, want a day", a.OpenKfID, i, a.Days[i].Day.Sub(a.Days[i-1].Day), i-1)
			}
		}
		if last := a.Days[len(a.Days)-1].Day; now.Sub(last) < 0 || now.Sub(last) >= 24*time.Hour {
			t.Fatalf("%s: the last day starts %s, want today's (UTC+8)", a.OpenKfID, last)
		}
	}
	if today := accts[0].Days[StatsDays-1]; today.CustomerMessages != 3 || today.Customers != 2 {
		t.Fatalf("wk1 today: %+v, want 3 messages from 2 customers", today)
	}
	if today := accts[1].Days[StatsDays-1]; today.CustomerMessages != 0 {
		t.Fatalf("wk2 today: %+v, want no messages", today)
	}
	if ttl := mini.TTL(sources.StatsKey(prefix)); ttl <= 0 || ttl > statsTTL {
		t.Fatalf("statistics key TTL %s, want up to %s", ttl, statsTTL)
	}
}
