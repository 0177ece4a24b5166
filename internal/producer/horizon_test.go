package producer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// gaugeOf returns the value of metric name{open_kfid=kf} in reg, and whether
// the series exists.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, kf string) (float64, bool) {
	t.Helper()
	return testenv.Gathered(t, reg, name, "open_kfid", kf)
}

// fakeWeChat is the fake WeChat with account kf on clock, and a client of
// it.
func fakeWeChat(t *testing.T, kf string, clock *testenv.Clock) (*wecomtest.Server, *wecom.Client) {
	t.Helper()
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kf}, Clock: clock.Now})
	t.Cleanup(fake.Close)
	wc, err := wecom.NewClient(wecom.ClientConfig{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fake, wc
}

// TestHorizonMetrics drives the sync of one account against the fake
// WeChat on a hand-moved clock and checks the two horizon gauges: the
// oldest waiting time is the send_time of a fetched message Kafka did not
// acknowledge, or the oldest unserved trigger when sync_msg fails; a
// successful pass removes it and stamps the last success.
func TestHorizonMetrics(t *testing.T) {
	const kf = "wk-horizon"
	t0 := time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)
	clock := testenv.NewClock(t0)
	fake, wc := fakeWeChat(t, kf, clock)
	st := newMemStore()
	pub := &recPublisher{}
	kafkaDown := errors.New("kafka down")
	var down atomic.Bool
	down.Store(true)
	pub.fail = func(int) error {
		if down.Load() {
			return kafkaDown
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	s, err := NewSyncer(unitCfg(), SyncerDeps{Source: WeComSource{wc}, Locker: &fakeLocker{s: st}, State: st, Publisher: pub,
		IDs: &seqIDs{}}, WithRegisterer(reg), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	const oldest, last = "kfpipe_sync_oldest_waiting_timestamp_seconds", "kfpipe_sync_last_success_timestamp_seconds"

	// Nothing triggered: no series.
	if _, ok := gaugeOf(t, reg, oldest, kf); ok {
		t.Fatal("oldest waiting exported before any trigger")
	}
	// Two messages sent at t0; Kafka is down; the sync runs 30 h later.
	fake.AddText(kf, "u1", "one")
	fake.AddText(kf, "u2", "two")
	clock.Advance(30 * time.Hour)
	if err := s.Trigger(kf, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(testenv.MetricValue(s.m.runs.WithLabelValues("produce_error")) >= 1, "a failed produce")
	})
	if v, ok := gaugeOf(t, reg, oldest, kf); !ok || v != float64(t0.Unix()) {
		t.Fatalf("oldest waiting = %v (exported %v), want the send_time %d of the unacknowledged messages", v, ok, t0.Unix())
	}
	if _, ok := gaugeOf(t, reg, last, kf); ok {
		t.Fatal("last success exported before any success")
	}

	// Kafka back: the retry (after the backoff on the clock) succeeds.
	down.Store(false)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(clock.Waiters() > 0, "the retry waiting on the clock") })
	clock.Advance(time.Second)
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(testenv.MetricValue(s.m.runs.WithLabelValues("ok")) >= 1, "a successful pass")
	})
	testenv.Eventually(t, 5*time.Second, func() error {
		_, ok := gaugeOf(t, reg, oldest, kf)
		return testenv.Check(!ok, "the oldest waiting series removed")
	})
	okAt := clock.Now()
	if v, ok := gaugeOf(t, reg, last, kf); !ok || v != float64(okAt.UnixNano())/1e9 {
		t.Fatalf("last success = %v (exported %v), want %v", v, ok, okAt.Unix())
	}
	if got := pub.ids(); len(got) != 2 {
		t.Fatalf("produced %v, want the 2 messages", got)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(s.idle(), "the syncer idle") })

	// sync_msg failing: nothing fetched, the oldest unserved trigger counts.
	fake.FailNext(1000, -1)
	clock.Advance(time.Hour)
	trig := clock.Now()
	if err := s.Trigger(kf, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(testenv.MetricValue(s.m.runs.WithLabelValues("source_error")) >= 1, "a failed sync_msg")
	})
	// Time passes, the retries keep failing, more triggers come: the
	// oldest unserved one stays.
	for range 3 {
		testenv.Eventually(t, 5*time.Second, func() error { return testenv.Check(clock.Waiters() > 0, "the retry waiting on the clock") })
		clock.Advance(time.Minute)
		_ = s.Trigger(kf, "")
	}
	if v, ok := gaugeOf(t, reg, oldest, kf); !ok || v != float64(trig.UnixNano())/1e9 {
		t.Fatalf("oldest waiting = %v (exported %v), want the first unserved trigger %v", v, ok, trig.Unix())
	}
	if v, _ := gaugeOf(t, reg, last, kf); v != float64(okAt.UnixNano())/1e9 {
		t.Fatalf("last success moved to %v while failing", v)
	}
	// What the console is told is what the gauges say.
	if st := s.statuses(clock.Now()); len(st) != 1 || st[0].OpenKfID != kf || !st[0].LastSuccess.Equal(okAt) ||
		!st[0].OldestWaiting.Equal(trig) || !st[0].Reported.Equal(clock.Now()) {
		t.Fatalf("sync status %+v, want last success %v and oldest waiting %v", st, okAt, trig)
	}
}

// TestSyncStatusPublished: kf-producer's Syncer with WithStatus writes
// each account's SyncStatus to Redis at start and every interval, and
// RedisState.SyncStatuses (what the console's overview reads) returns
// them as written.
func TestSyncStatusPublished(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	state := NewRedisState(rdb, prefix)
	const kf = "wk-status"
	t0 := time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)
	clock := testenv.NewClock(t0)
	fake, wc := fakeWeChat(t, kf, clock)
	st := newMemStore()
	s, err := NewSyncer(unitCfg(), SyncerDeps{Source: WeComSource{wc}, Locker: &fakeLocker{s: st}, State: st,
		Publisher: &recPublisher{}, IDs: &seqIDs{}}, WithClock(clock), WithStatus(state, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	fake.AddText(kf, "u1", "one")
	s.Start()
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := s.Trigger(kf, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(testenv.MetricValue(s.m.runs.WithLabelValues("ok")) >= 1, "a successful pass")
	})
	okAt := clock.Now()
	// The write at start may already carry the pass (reported at okAt, the
	// clock not advanced yet); the next one is due a minute later on the
	// clock, so wait for a status reported after the pass.
	var got []SyncStatus
	testenv.Eventually(t, 5*time.Second, func() error {
		clock.Advance(time.Minute)
		got, err = state.SyncStatuses(context.Background())
		return testenv.Check(err == nil && len(got) == 1 && got[0].LastSuccess.Equal(okAt) && got[0].Reported.After(okAt), "the published status")
	})
	if got[0].OpenKfID != kf || !got[0].OldestWaiting.IsZero() || !got[0].Reported.After(okAt) {
		t.Fatalf("published %+v, want %s synced at %v, nothing waiting, reported after", got[0], kf, okAt)
	}
}

// TestHorizonLeftToTheLockHolder: a replica that finds the account's lock
// held by another drops its waiting time (the holder reports it), so a
// replica that lost the race does not alert for an account that syncs.
func TestHorizonLeftToTheLockHolder(t *testing.T) {
	r := newRig(t, unitCfg(), nil, nil)
	r.lk.busyFor.Store(2) // the try and the retry after the pending flag
	if err := r.s.Trigger("wk-1", ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Check(testenv.MetricValue(r.s.m.busy) == 1 && r.s.idle(), "the busy lock handed over")
	})
	if w := r.s.oldestWaiting(); len(w) != 0 {
		t.Fatalf("oldest waiting %v after the lock was busy, want none", w)
	}
}
