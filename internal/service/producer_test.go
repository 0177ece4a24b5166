package service

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/idgen"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// TestProducerReallocatesLostWorkerID takes the producer's worker ID away
// (as an expiry during a Redis outage would): the sync pauses, a new ID is
// allocated, and syncing resumes with it without a restart.
func TestProducerReallocatesLostWorkerID(t *testing.T) {
	pc := newPlace(t)
	rdb, prefix := pc.rdb, pc.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const kf = "wk-realloc"
	tp := pc.startTestProducer(t, ctx, kf, func(cfg *config.Producer) {
		cfg.IDGen.Allocator.TTL = 3 * time.Second // renewed every second
	})
	cfg, base, p, fake := tp.cfg, tp.base, tp.p, tp.fake

	keys := func() map[string]string {
		out := map[string]string{}
		for _, k := range rdb.Keys(ctx, prefix+"idgen:worker:*").Val() {
			out[k] = rdb.Get(ctx, k).Val()
		}
		return out
	}
	before := keys()
	if len(before) != 1 {
		t.Fatalf("worker keys %v, want one", before)
	}
	var stolen, owner string
	for k, v := range before {
		stolen, owner = k, v
	}
	rdb.Set(ctx, stolen, "another-producer", 0)

	testenv.Eventually(t, 30*time.Second, func() error {
		for k, v := range keys() {
			if k != stolen && v == owner {
				return nil
			}
		}
		return testenv.Check(false, "a new worker id")
	})
	testenv.Eventually(t, 10*time.Second, func() error {
		fail := base.Ops.Ready(ctx)
		_, lost := fail["worker_id"]
		_, syncBad := fail["sync"]
		return testenv.Check(!lost && !syncBad, "ready again")
	})
	fake.AddText(kf, "wm-after", "still flowing")
	sender := &wecomtest.CallbackSender{URL: p.CallbackURL, Token: cfg.Callback.Token,
		AESKey: cfg.Callback.EncodingAESKey, CorpID: cfg.WeCom.CorpID}
	resp, err := sender.SendEvent(ctx, kf, fake.IssueToken(kf))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 30*time.Second, func() error {
		return testenv.Check(rdb.Get(ctx, prefix+"cursor:"+kf).Val() == fake.LastCursor(kf), "cursor advanced after re-allocation")
	})
	if v := rdb.Get(ctx, stolen).Val(); !strings.Contains(v, "another-producer") {
		t.Fatalf("the stolen key was overwritten: %q", v)
	}
}

// TestProducerWorkerIDOnEtcd: with idgen.allocator.backend etcd the worker
// ID is an instance ID of coord's allocator (one implementation), shown in
// the producer's fleet entry; when someone else rewrites its key the
// producer takes a new one (and its fleet entry says so) without a
// restart, leaving the other writer's key alone.
func TestProducerWorkerIDOnEtcd(t *testing.T) {
	pc := newPlace(t)
	raw, ns := testenv.Etcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := pc.startTestProducer(t, ctx, "wk-etcd", func(cfg *config.Producer) {
		cfg.IDGen.Allocator.Backend = "etcd"
		cfg.Coord.Enabled, cfg.Coord.Endpoints, cfg.Coord.Namespace = true, testenv.EtcdEndpoints(t), ns
		cfg.Coord.KeepAlive = 3 * time.Second
	}).base

	ids := func() map[string]string {
		resp, err := raw.Get(ctx, ns+"instance_ids/"+idgen.EtcdService+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, kv := range resp.Kvs {
			out[string(kv.Key)] = string(kv.Value)
		}
		return out
	}
	before := ids()
	if len(before) != 1 {
		t.Fatalf("worker id keys %v, want one", before)
	}
	var taken, owner string
	for k, v := range before {
		taken, owner = k, v
	}
	fleetWorkerID := func() int { return base.Fleet.Member().WorkerID }
	first := fleetWorkerID()
	if want, _ := strconv.Atoi(taken[strings.LastIndex(taken, "/")+1:]); first != want-1 {
		t.Fatalf("fleet worker_id %d, want %d (key %s)", first, want-1, taken)
	}
	if _, err := raw.Put(ctx, taken, "another-producer"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for k, v := range ids() {
			if k != taken && v == owner {
				return nil
			}
		}
		return testenv.Check(false, "a new worker id")
	})
	testenv.Eventually(t, 10*time.Second, func() error {
		fail := base.Ops.Ready(ctx)
		_, lost := fail["worker_id"]
		return testenv.Check(!lost && fleetWorkerID() >= 0 && fleetWorkerID() != first, "ready again, the fleet entry showing the new id")
	})
	if v := ids()[taken]; v != "another-producer" {
		t.Fatalf("the taken key was overwritten: %q", v)
	}
}

// testProducer is a kf-producer started at a place against a fake WeChat
// with account kf (wecom.open_kfids empty: it lists the accounts); edit
// adjusts its configuration first.
type testProducer struct {
	cfg  *config.Producer
	base *daemon.Base
	p    *Producer
	fake *wecomtest.Server
}

func (pc *place) startTestProducer(t *testing.T, ctx context.Context, kf string, edit func(*config.Producer)) testProducer {
	t.Helper()
	fake := wecomtest.New(wecomtest.Options{CorpID: "ww-test-corp", Secret: "test-secret", Accounts: []string{kf}})
	t.Cleanup(fake.Close)
	cfg := pc.producerConfig(t, fake)
	edit(cfg)
	base := startBase(t, ctx, "kf-producer", cfg.Common)
	p, err := StartProducer(ctx, cfg, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return testProducer{cfg: cfg, base: base, p: p, fake: fake}
}
