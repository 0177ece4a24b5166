package service

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// The console's statistics (docs/operations.md, "Statistics per account"):
// kf-producer, which holds the WeChat credentials, reads each account's
// last StatsDays days of get_corp_statistic shortly after start and every
// statsInterval, and writes them to one Redis hash (field: open_kfid,
// value: the days as JSON); dlq-consumer's admin API reads the hash for
// the overview. The admin thus needs no WeChat secret: a console that can
// be opened by viewers never holds the credential that sends messages in
// the corp's name.
const (
	// StatsDays is how many days the console shows, today included.
	StatsDays = 7
	// statsInterval: WeChat computes a day's statistics once, after it.
	statsInterval = time.Hour
	// statsFirst: the first collection, once kf-producer listed its
	// accounts.
	statsFirst = 15 * time.Second
	// statsTTL outlives a few missed collections; a stopped kf-producer's
	// figures then disappear instead of ageing silently.
	statsTTL = 48 * time.Hour
)

// chinaTime is WeChat's day: statistics start at midnight UTC+8.
var chinaTime = time.FixedZone("UTC+8", 8*3600)

// statsRange is the StatsDays days up to now's day, as WeChat counts days.
func statsRange(now time.Time) (from, to time.Time) {
	d := now.In(chinaTime)
	to = time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, chinaTime)
	return to.AddDate(0, 0, -(StatsDays - 1)), to
}

// collectStats writes the accounts' statistics once; an account whose
// call fails keeps its previous figures and the error is returned joined.
func collectStats(ctx context.Context, kc *kf.Client, rdb redis.UniversalClient, prefix string, accounts []string,
	now time.Time) error {
	from, to := statsRange(now)
	vals := map[string]any{}
	var firstErr error
	for _, id := range accounts {
		days, err := kc.CorpStatistics(ctx, id, from, to)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("statistics of %s: %w", id, err)
			}
			continue
		}
		out := make([]console.AccountDay, len(days))
		for i, d := range days {
			out[i] = console.AccountDay{Day: d.Day.In(chinaTime), Sessions: d.SessionCount, Customers: d.CustomerCount,
				CustomerMessages: d.CustomerMsgCount, HandedOn: d.UpgradeServiceCount}
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		vals[id] = b
	}
	if len(vals) > 0 {
		pipe := rdb.TxPipeline()
		pipe.HSet(ctx, sources.StatsKey(prefix), vals)
		pipe.Expire(ctx, sources.StatsKey(prefix), statsTTL)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("write statistics: %w", err)
		}
	}
	return firstErr
}

// startStats runs kf-producer's statistics collector (no WeChat
// credentials: none).
func (p *Producer) startStats(ctx context.Context, cfg *config.Producer, base *daemon.Base) error {
	if cfg.WeCom.CorpID == "" || cfg.WeCom.Secret == "" {
		return nil
	}
	kc, err := kf.New(kf.Config{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout, Tokens: wecom.NewRedisTokenCache(base.Redis, cfg.Redis.KeyPrefix)})
	if err != nil {
		return err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// The first collection waits for the account listing at start.
		t := time.NewTimer(statsFirst)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			t.Reset(statsInterval)
			if err := collectStats(ctx, kc, base.Redis, cfg.Redis.KeyPrefix, p.Syncer.Accounts(), time.Now()); err != nil &&
				ctx.Err() == nil {
				base.Log.Warn("collecting the accounts' statistics failed; the console shows the last collected",
					zap.Error(err), zap.Duration("retry_in", statsInterval))
			}
		}
	}()
	return nil
}
