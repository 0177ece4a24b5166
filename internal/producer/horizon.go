package producer

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// WeChat keeps a customer-service message for 3 days: one not fetched with
// sync_msg and produced by then is lost. The horizon metrics say, per
// open_kfid, how close each account is to that horizon (docs/operations.md,
// KfpipeWeChatHorizonWarning and KfpipeWeChatHorizonCritical):
//
//   - kfpipe_sync_last_success_timestamp_seconds: when this process last
//     finished a pass (sync_msg down to has_more=0, every page produced
//     and its cursor stored).
//   - kfpipe_sync_oldest_waiting_timestamp_seconds: since when messages
//     may be waiting in WeChat, not yet in Kafka. It is the earlier of
//     (a) the send_time of the oldest message fetched from sync_msg but not
//     yet acknowledged by Kafka (the page the cursor stays before when a
//     produce fails), and (b) the time of the oldest sync trigger — a
//     WeChat callback, or the safety sync of a configured account — not
//     yet served by a successful pass (when sync_msg itself fails, or
//     syncing is paused or suppressed, nothing newer can be known). The
//     series exists only while something waits: a healthy account has it
//     for the moment of a pass, and it disappears when a pass succeeds.
//     While another replica holds the account's sync lock this process
//     drops its series: the holder reports.
//
// Both are kept in memory: after a restart (a) is learnt again at the first
// failing pass (the cursor did not move, the same page comes back) and (b)
// restarts from the start-up sync.

// horizon holds what the horizon metrics export; guarded by healthMu.
type horizon struct {
	triggered map[string]time.Time // oldest trigger not served by a successful pass
	fetched   map[string]time.Time // send_time of the oldest fetched, unacknowledged message
	ok        map[string]time.Time // last successful pass, while this process holds the account
}

// horizonCollector exports kfpipe_sync_oldest_waiting_timestamp_seconds at
// scrape time.
type horizonCollector struct {
	s    *Syncer
	desc *prometheus.Desc
}

func (c horizonCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c horizonCollector) Collect(ch chan<- prometheus.Metric) {
	for kf, at := range c.s.oldestWaiting() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(at.UnixNano())/1e9, kf)
	}
}

func newHorizonCollector(s *Syncer) horizonCollector {
	return horizonCollector{s: s, desc: prometheus.NewDesc("kfpipe_sync_oldest_waiting_timestamp_seconds",
		"Per open_kfid, since when messages may be waiting in WeChat and not yet in Kafka (WeChat drops them after 72 h): "+
			"the earlier of the send_time of the oldest fetched message Kafka has not acknowledged and the oldest sync trigger "+
			"no successful pass has served. Absent when nothing waits.",
		[]string{"open_kfid"}, nil)}
}

// oldestWaiting returns, per open_kfid with something waiting, the earlier
// of its two horizon times.
func (s *Syncer) oldestWaiting() map[string]time.Time {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	out := make(map[string]time.Time, len(s.hz.triggered)+len(s.hz.fetched))
	for kf, t := range s.hz.triggered {
		out[kf] = t
	}
	for kf, t := range s.hz.fetched {
		if o, ok := out[kf]; !ok || t.Before(o) {
			out[kf] = t
		}
	}
	return out
}

// noteTrigger records a trigger of kf unless an older one is unserved.
func (s *Syncer) noteTrigger(kf string) {
	now := s.clock.Now()
	s.healthMu.Lock()
	if _, ok := s.hz.triggered[kf]; !ok {
		s.hz.triggered[kf] = now
	}
	s.healthMu.Unlock()
}

// noteUnacknowledged records the oldest send_time of items, fetched but not
// acknowledged by Kafka.
func (s *Syncer) noteUnacknowledged(kf string, items []*chatmsg.ChatMessage) {
	var oldest int64
	for i := range items {
		if t := items[i].SendTime; t > 0 && (oldest == 0 || t < oldest) {
			oldest = t
		}
	}
	if oldest == 0 {
		return
	}
	at := time.Unix(oldest, 0)
	s.healthMu.Lock()
	if o, ok := s.hz.fetched[kf]; !ok || at.Before(o) {
		s.hz.fetched[kf] = at
	}
	s.healthMu.Unlock()
}

// noteSuccess records a successful pass of kf that started at start: it
// served every trigger up to start and every fetched message.
func (s *Syncer) noteSuccess(kf string, start time.Time) {
	now := s.clock.Now()
	s.healthMu.Lock()
	if t, ok := s.hz.triggered[kf]; ok && !t.After(start) {
		delete(s.hz.triggered, kf)
	}
	delete(s.hz.fetched, kf)
	s.hz.ok[kf] = now
	s.healthMu.Unlock()
	s.m.lastSuccess.WithLabelValues(kf).Set(float64(now.UnixNano()) / 1e9)
}

// forgetWaiting drops kf's horizon times: another replica holds its lock
// and reports them.
func (s *Syncer) forgetWaiting(kf string) {
	s.healthMu.Lock()
	delete(s.hz.triggered, kf)
	delete(s.hz.fetched, kf)
	delete(s.hz.ok, kf)
	s.healthMu.Unlock()
}

// SyncStatus is one account's horizon as the console shows it: what this
// replica's metrics export, published to the shared store by the replica
// that syncs the account (WithStatus).
type SyncStatus struct {
	OpenKfID string `json:"open_kfid"`
	// LastSuccess is the end of the last successful pass (zero: none since
	// the replica started).
	LastSuccess time.Time `json:"last_success,omitzero"`
	// OldestWaiting is since when messages may wait in WeChat, not yet in
	// Kafka (zero: nothing waits).
	OldestWaiting time.Time `json:"oldest_waiting,omitzero"`
	// Reported is when the replica wrote this; a status far older than the
	// publishing interval comes from a replica that stopped.
	Reported time.Time `json:"reported"`
}

// StatusInterval is how often kf-producer publishes the accounts'
// SyncStatus; the console calls a status older than three intervals stale.
const StatusInterval = 10 * time.Second

// StatusWriter stores the accounts' SyncStatus for the console.
type StatusWriter interface {
	WriteSyncStatus(ctx context.Context, st []SyncStatus) error
}

// WithStatus publishes the accounts' SyncStatus to w every interval (and
// once at start): the console's overview reads them (docs/operations.md).
func WithStatus(w StatusWriter, every time.Duration) Option {
	return func(s *Syncer) { s.status, s.statusEvery = w, every }
}

// statuses returns the SyncStatus of every account this process holds or
// has something waiting for, as of now.
func (s *Syncer) statuses(now time.Time) []SyncStatus {
	waiting := s.oldestWaiting()
	s.healthMu.Lock()
	byKf := make(map[string]*SyncStatus, len(s.hz.ok)+len(waiting))
	for kf, at := range s.hz.ok {
		byKf[kf] = &SyncStatus{OpenKfID: kf, LastSuccess: at, Reported: now}
	}
	s.healthMu.Unlock()
	for kf, at := range waiting {
		st := byKf[kf]
		if st == nil {
			st = &SyncStatus{OpenKfID: kf, Reported: now}
			byKf[kf] = st
		}
		st.OldestWaiting = at
	}
	s.discoveredStatuses(byKf, now)
	out := make([]SyncStatus, 0, len(byKf))
	for _, st := range byKf {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b SyncStatus) int { return strings.Compare(a.OpenKfID, b.OpenKfID) })
	return out
}

// statusLoop publishes the statuses every statusEvery until Stop.
func (s *Syncer) statusLoop() {
	defer s.wg.Done()
	for {
		if st := s.statuses(s.clock.Now()); len(st) > 0 {
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			if err := s.status.WriteSyncStatus(ctx, st); err != nil && s.ctx.Err() == nil {
				s.log.Warn("publishing the accounts' sync status", zap.Error(err))
			}
			cancel()
		}
		select {
		case <-s.clock.After(s.statusEvery):
		case <-s.ctx.Done():
			return
		}
	}
}
