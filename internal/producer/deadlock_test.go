package producer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// A kf-producer killed while syncing leaves its account's lock held until
// the lock's TTL runs out. The restarted producer finds it busy and leaves
// the pending flag — which nobody serves, the holder being dead — so it
// must try again when the lock can be taken, not at the next safety tick
// (an hour here) or callback. With Redis it waits the lock's remaining TTL
// (PTTL: 2 s, shorter than its own sync.lock_ttl of 6 s); with etcd, whose
// Locker does not say, at most its sync.lock_ttl.
func TestIntegrationDeadHoldersLockRetriedWhenItExpires(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	const deadTTL, lockTTL = 2 * time.Second, 6 * time.Second
	for _, tc := range []struct {
		name string
		// kill leaves a lock on name held by a process that died (no
		// extension, no release) for deadTTL, and returns the Syncer's
		// Locker and State.
		kill   func(t *testing.T, name string) (Locker, State, *RedisState)
		within time.Duration
	}{
		{"redis", func(t *testing.T, name string) (Locker, State, *RedisState) {
			rdb, prefix := testenv.Redis(t)
			if _, err := lock.New(rdb, "", lock.WithAutoExtend(false)).TryLock(t.Context(), prefix+name, deadTTL); err != nil {
				t.Fatal(err)
			}
			st := NewRedisState(rdb, prefix)
			t.Cleanup(func() { _ = rdb.Del(context.Background(), prefix+name).Err() })
			return LockAdapter{lock.New(rdb, "")}, st, st
		}, deadTTL + 2*time.Second},
		{"etcd", func(t *testing.T, name string) (Locker, State, *RedisState) {
			raw, ns := testenv.Etcd(t)
			rdb, prefix := testenv.Redis(t)
			p := coordtest.Provider(t, ns)
			// The waiter key a concurrency.Mutex writes, on a lease nobody
			// keeps alive.
			lease, err := raw.Grant(t.Context(), int64(deadTTL/time.Second))
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("%slocks/sync/%s%s/%x", ns, prefix, name, lease.ID)
			if _, err := raw.Put(t.Context(), key, "", clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			st := NewRedisState(rdb, prefix)
			return EtcdLocker{P: p}, EtcdState{RedisState: st, CC: p.Config()}, st
		}, lockTTL + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const kf = "wk-dead"
			killed := time.Now()
			locker, state, rstate := tc.kill(t, "lock:sync:"+kf)
			fake := wecomtest.New(wecomtest.Options{Accounts: []string{kf}})
			t.Cleanup(fake.Close)
			appendTraffic(fake, []string{kf}, 5, 0, 50)
			topic := testenv.Topic(t, 2)

			kp, err := NewKafkaProducer(kafkaCfg(brokers), prometheus.NewRegistry(), nil)
			if err != nil {
				t.Fatal(err)
			}
			wc, err := wecom.NewClient(wecom.ClientConfig{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.InfoLevel)
			s, err := NewSyncer(SyncerConfig{Topic: topic, KeyPrefix: rstate.prefix, PageLimit: 1000, LockTTL: lockTTL,
				SafetyInterval: time.Hour, RetryBase: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond, Workers: 2,
				DeliveryWait: 5 * time.Second},
				SyncerDeps{Source: WeComSource{wc}, Locker: locker, State: state, Publisher: kp, IDs: newSnowIDs(t, 7)},
				WithRegisterer(prometheus.NewRegistry()), WithLogger(zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))))
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := s.Stop(ctx); err != nil {
					t.Error(err)
				}
				_ = kp.Close(ctx)
			})

			start := time.Now()
			if err := s.Trigger(kf, fake.IssueToken(kf)); err != nil {
				t.Fatal(err)
			}
			for deadline := killed.Add(tc.within); ; time.Sleep(20 * time.Millisecond) {
				c, err := state.Cursor(t.Context(), kf)
				if err != nil {
					t.Fatal(err)
				}
				if c == fake.LastCursor(kf) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not synced %s after the kill (lock busy %v times; the safety tick is an hour away)",
						tc.within, testenv.MetricValue(s.m.busy))
				}
			}
			took := time.Since(killed)
			t.Logf("synced %s after the kill, %s after the trigger that found the dead holder's lock", took, time.Since(start))
			if testenv.MetricValue(s.m.busy) < 1 || took < deadTTL-100*time.Millisecond {
				t.Fatalf("synced after %s with %v busy locks: the dead holder's lock was not in the way", took, testenv.MetricValue(s.m.busy))
			}
			if logs.FilterMessageSnippet("retrying when it expires").Len() == 0 {
				t.Fatal("no log says the sync waits for the held lock")
			}
			checkRecords(t, readTopic(t, brokers, topic), map[string][]*chatmsg.ChatMessage{kf: fake.Messages(kf)}, true)
		})
	}
}
