package service

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// accountsRetry is how soon a failed account listing is tried again.
const accountsRetry = 5 * time.Second

// startDiscovery makes kf-producer find the corp's accounts instead of
// reading them from wecom.open_kfids (internal/producer/accounts.go): with
// open_kfids empty it lists them (account/list) at start, after every
// kf_account_auth_change callback and every wecom.accounts_refresh, and
// hands the list to the Syncer, which starts a new account's sync at once
// and stops a removed one's. The callback's own added and removed accounts
// are applied before the listing, so a change is served within the
// callback's round trip. It returns the callback option.
func (p *Producer) startDiscovery(ctx context.Context, cfg *config.Producer, base *daemon.Base) (wecom.HandlerOption, error) {
	poke := make(chan struct{}, 1)
	opt := wecom.WithAccountsChanged(func(added, removed []string) {
		p.Syncer.RemoveAccounts(removed)
		p.Syncer.AddAccounts(added)
		select {
		case poke <- struct{}{}:
		default:
		}
	})
	if len(cfg.WeCom.OpenKfIDs) > 0 {
		return opt, nil // the configured accounts, no listing
	}
	kc, err := kf.New(kf.Config{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout, Tokens: wecom.NewRedisTokenCache(base.Redis, cfg.Redis.KeyPrefix)})
	if err != nil {
		return nil, err
	}
	log := base.Log
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			wait := cfg.WeCom.AccountsRefresh
			accts, err := kc.Accounts(ctx)
			if err != nil {
				log.Warn("listing the customer-service accounts failed; the accounts known so far keep syncing",
					zap.Error(err), zap.Duration("retry_in", accountsRetry))
				wait = accountsRetry
			} else {
				ids := make([]string, len(accts))
				for i, a := range accts {
					ids[i] = a.OpenKfID
				}
				added, removed := p.Syncer.SetAccounts(ids)
				log.Info("customer-service accounts listed", zap.Int("accounts", len(ids)),
					zap.Strings("added", added), zap.Strings("removed", removed))
			}
			var tick <-chan time.Time
			var t *time.Timer
			if wait > 0 {
				t = time.NewTimer(wait)
				tick = t.C
			}
			select {
			case <-ctx.Done():
			case <-poke:
			case <-tick:
			}
			if t != nil {
				t.Stop()
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return opt, nil
}
