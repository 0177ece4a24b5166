package producer

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

func zapKf(kf string) zap.Field  { return zap.String("open_kfid", kf) }
func zapErr(err error) zap.Field { return zap.Error(err) }

// The accounts a Syncer syncs. With wecom.open_kfids set they are that
// list (an allow list: nothing else is synced); otherwise they are
// discovered: kf-producer lists the corp's accounts at start, on every
// kf_account_auth_change callback and every wecom.accounts_refresh, and
// SetAccounts makes the Syncer sync the accounts listed — a new one at
// once, without a restart — and stop syncing the ones gone. A callback for
// an account not listed yet is served (WeChat's callback shows it exists)
// and the account joins the set. wecom.deny_open_kfids are never synced.
// An account a kf_account_auth_change removed (RemoveAccounts) is refused
// until a listing or an auth change adds it again.

// accountSet is the Syncer's accounts (guarded by mu).
type accountSet struct {
	mu      sync.Mutex
	synced  map[string]bool
	removed map[string]bool
	// discovering: SetAccounts was called (kf-producer lists the
	// accounts); a callback's account then joins the set.
	discovering bool
}

func (s *Syncer) initAccounts() {
	s.acct.synced, s.acct.removed = map[string]bool{}, map[string]bool{}
	for _, kf := range s.cfg.OpenKfIDs {
		if !slices.Contains(s.cfg.DenyOpenKfIDs, kf) {
			s.acct.synced[kf] = true
		}
	}
}

// configAllows reports whether the configuration lets kf be synced.
func (s *Syncer) configAllows(kf string) bool {
	if slices.Contains(s.cfg.DenyOpenKfIDs, kf) {
		return false
	}
	return len(s.cfg.OpenKfIDs) == 0 || slices.Contains(s.cfg.OpenKfIDs, kf)
}

// admit reports whether a trigger of kf may be served, adding a
// discovered account the callback revealed.
func (s *Syncer) admit(kf string) bool {
	if !s.configAllows(kf) {
		return false
	}
	s.acct.mu.Lock()
	defer s.acct.mu.Unlock()
	if s.acct.removed[kf] {
		return false
	}
	if s.acct.discovering {
		s.acct.synced[kf] = true
	}
	return true
}

// Accounts returns the accounts the Syncer syncs, sorted.
func (s *Syncer) Accounts() []string {
	s.acct.mu.Lock()
	defer s.acct.mu.Unlock()
	out := make([]string, 0, len(s.acct.synced))
	for kf := range s.acct.synced {
		out = append(out, kf)
	}
	slices.Sort(out)
	return out
}

// SetAccounts makes listed (the corp's accounts as account/list returned
// them) the accounts synced, within the configuration's allow and deny
// lists: a new account is triggered at once, an account no longer listed
// is no longer synced. With wecom.open_kfids set, a listing adds nothing
// and removes nothing (the list is the configuration's). It returns the
// accounts added and removed.
func (s *Syncer) SetAccounts(listed []string) (added, removed []string) {
	if len(s.cfg.OpenKfIDs) > 0 {
		return s.AddAccounts(listed), nil
	}
	want := map[string]bool{}
	for _, kf := range listed {
		if kf != "" && s.configAllows(kf) {
			want[kf] = true
		}
	}
	s.acct.mu.Lock()
	s.acct.discovering = true
	for kf := range s.acct.synced {
		if !want[kf] {
			delete(s.acct.synced, kf)
			removed = append(removed, kf)
		}
	}
	for kf := range want {
		delete(s.acct.removed, kf)
		if !s.acct.synced[kf] {
			s.acct.synced[kf] = true
			added = append(added, kf)
		}
	}
	s.acct.mu.Unlock()
	s.started(added, removed)
	return added, removed
}

// AddAccounts syncs the accounts an auth change added (within the
// configuration's lists) and returns the ones new to the set.
func (s *Syncer) AddAccounts(ids []string) (added []string) {
	s.acct.mu.Lock()
	for _, kf := range ids {
		if kf == "" || !s.configAllows(kf) {
			continue
		}
		delete(s.acct.removed, kf)
		if !s.acct.synced[kf] {
			s.acct.synced[kf] = true
			added = append(added, kf)
		}
	}
	s.acct.mu.Unlock()
	s.started(added, nil)
	return added
}

// RemoveAccounts stops syncing the accounts an auth change removed; a
// callback for one of them is refused until it is added again.
func (s *Syncer) RemoveAccounts(ids []string) (removed []string) {
	s.acct.mu.Lock()
	for _, kf := range ids {
		if kf == "" {
			continue
		}
		s.acct.removed[kf] = true
		if s.acct.synced[kf] {
			delete(s.acct.synced, kf)
			removed = append(removed, kf)
		}
	}
	s.acct.mu.Unlock()
	s.started(nil, removed)
	return removed
}

// started triggers the accounts added and forgets the horizon of the ones
// removed (their status is no longer published).
func (s *Syncer) started(added, removed []string) {
	for _, kf := range removed {
		s.forgetWaiting(kf)
		s.m.lastSuccess.DeleteLabelValues(kf)
		s.log.Info("account no longer synced", zapKf(kf))
	}
	if r, ok := s.status.(interface {
		RemoveSyncStatus(ctx context.Context, kfs []string) error
	}); ok && len(removed) > 0 {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		if err := r.RemoveSyncStatus(ctx, removed); err != nil {
			s.log.Warn("dropping the status of accounts no longer synced", zapErr(err))
		}
		cancel()
	}
	for _, kf := range added {
		s.log.Info("account discovered: syncing it", zapKf(kf))
		if err := s.Trigger(kf, ""); err != nil {
			s.log.Warn("first sync of a discovered account", zapKf(kf), zapErr(err))
		}
	}
}

// discoveredStatuses adds the synced accounts without a status yet to
// byKf, when the accounts are discovered: the console lists every account
// kf-producer syncs, a new one before its first pass.
func (s *Syncer) discoveredStatuses(byKf map[string]*SyncStatus, now time.Time) {
	s.acct.mu.Lock()
	defer s.acct.mu.Unlock()
	if !s.acct.discovering {
		return
	}
	for kf := range s.acct.synced {
		if byKf[kf] == nil {
			byKf[kf] = &SyncStatus{OpenKfID: kf, Reported: now}
		}
	}
}

// removedAccount reports whether an auth change removed kf.
func (s *Syncer) removedAccount(kf string) bool {
	s.acct.mu.Lock()
	defer s.acct.mu.Unlock()
	return s.acct.removed[kf]
}
