package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/idgen"
	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Producer is a running kf-producer.
type Producer struct {
	Syncer      *producer.Syncer
	CallbackURL string

	log    *zap.Logger
	kp     *producer.KafkaProducer
	http   *http.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ids    generator
	keeper *idgen.Keeper
	media  *media.Keeper // nil: media keeping off
}

// generator is the Snowflake generator behind an atomic pointer: when the
// worker ID is lost and allocated anew, the generator is swapped under the
// running Syncer.
type generator struct {
	p atomic.Pointer[idgen.Generator]
}

func (g *generator) Next() (int64, error) { return g.p.Load().Next() }

// StartProducer starts the kf-producer: a worker ID from the allocator, the
// Snowflake generator, the async Kafka producer, the sync loop and the
// callback endpoint.
func StartProducer(ctx context.Context, cfg *config.Producer, base *daemon.Base) (*Producer, error) {
	p := &Producer{log: base.Log}
	logProducerSettings(base.Log, cfg)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	fail := func(err error) (*Producer, error) {
		_ = p.Close(context.Background())
		return nil, err
	}
	if err := p.startWorkerID(ctx, cfg, base); err != nil {
		return fail(err)
	}
	if err := p.startSync(rctx, cfg, base); err != nil {
		return fail(err)
	}
	p.keeper.Start(rctx)
	base.Ops.AddCheck("sync", func(context.Context) error { return p.Syncer.Healthy() })
	base.Ops.AddCheck("worker_id", func(context.Context) error { return p.keeper.Err() })
	base.Ops.AddCheck("kafka_producer", p.kp.Ready)
	accounts, err := p.startDiscovery(rctx, cfg, base)
	if err != nil {
		return fail(err)
	}
	if err := p.startStats(rctx, cfg, base); err != nil {
		return fail(err)
	}
	if err := p.startCallback(cfg, base, accounts); err != nil {
		return fail(err)
	}
	return p, nil
}

// startWorkerID takes a worker ID and installs a Snowflake generator for
// it. Duplicate IDs would collide Snowflake IDs, so losing the allocation
// pauses the sync (and makes the process unready) until the keeper has
// allocated a new one.
func (p *Producer) startWorkerID(ctx context.Context, cfg *config.Producer, base *daemon.Base) error {
	log, reg := base.Log, base.Registry
	acfg := idgen.AllocatorFromConfig(cfg.IDGen, cfg.Redis.KeyPrefix, nodeName())
	// Metrics are registered by the first allocator and generator only: a
	// re-allocation must not register them twice.
	idOpts := []idgen.Option{idgen.WithLogger(log), idgen.WithRegisterer(reg)}
	newAlloc := func() (idgen.Allocator, error) {
		defer func() { idOpts = []idgen.Option{idgen.WithLogger(log)} }()
		if cfg.IDGen.Allocator.Backend == "etcd" {
			return idgen.NewEtcdAllocator(base.Coord, acfg, idOpts...)
		}
		return idgen.NewRedisAllocator(base.Redis, acfg, idOpts...)
	}
	genOpts := []idgen.Option{idgen.WithRegisterer(reg)}
	install := func(workerID int) error {
		defer func() { genOpts = nil }()
		gen, err := idgen.New(idgen.SnowflakeFromConfig(cfg.IDGen, workerID), genOpts...)
		if err != nil {
			return err
		}
		p.ids.p.Store(gen)
		if base.Fleet != nil {
			// Also on a re-allocation, long after start: its own deadline.
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			base.Fleet.Update(uctx, func(m *fleet.Member) { m.WorkerID = workerID })
			cancel()
		}
		return nil
	}
	// Lost and Regained run only once the keeper is started, after the
	// Syncer exists.
	keeper, err := idgen.NewKeeper(idgen.KeeperConfig{NewAllocator: newAlloc, Install: install,
		Lost: func(err error) { p.Syncer.Pause(err) }, Regained: func() { p.Syncer.Resume() }, Logger: log})
	if err != nil {
		return err
	}
	p.keeper = keeper
	return keeper.Allocate(ctx)
}

// startSync starts the async Kafka producer and, once the producer has
// warmed up (KafkaProducer.WaitReady: its idempotent producer ID assigned,
// the main topic's leaders known), the sync loop on the WeChat client.
// Until then no page is fetched — a page fetched earlier would only wait in
// librdkafka's queue — and /readyz names the kafka_producer check; callback
// triggers received meanwhile are queued.
func (p *Producer) startSync(ctx context.Context, cfg *config.Producer, base *daemon.Base) error {
	log, reg, prefix := base.Log, base.Registry, cfg.Redis.KeyPrefix
	var err error
	p.kp, err = producer.NewKafkaProducer(cfg.Kafka, reg, log)
	if err != nil {
		return err
	}
	wc, err := wecom.NewClient(wecom.ClientConfig{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout}, wecom.NewRedisTokenCache(base.Redis, prefix),
		wecom.WithClientLogger(log), wecom.WithClientRegisterer(reg))
	if err != nil {
		return err
	}
	// The media of each page Kafka took is kept right away (docs/media.md).
	if p.media, err = media.FromConfig(ctx, cfg.Media, cfg.WeCom, wecom.NewRedisTokenCache(base.Redis, prefix), log, reg); err != nil {
		return err
	}
	p.media.Start()
	state := producer.NewRedisState(base.Redis, prefix)
	var locker producer.Locker = producer.LockAdapter{Locker: lock.New(base.Redis, "", lock.WithLogger(log), lock.WithRegisterer(reg))}
	var cursors producer.State = state
	if cfg.Sync.Lock.Backend == "etcd" {
		// The lock and the cursor it fences live in etcd; the pending
		// flags and the status stay in Redis.
		locker = producer.EtcdLocker{P: base.Coord}
		cursors = producer.EtcdState{RedisState: state, CC: base.Coord.Config()}
	}
	switch {
	case cfg.Sync.Lock.Backend == "etcd":
		log.Info("sync lock: etcd (coord), fenced; cursors in etcd")
	case cfg.Redis.Mode == "cluster":
		log.Warn("sync lock: Redis Cluster, a single-master lock: a master failover before its replica " +
			"has the lock may let two producers sync one account at once (the fenced cursor write keeps " +
			"the cursor safe; messages may be produced twice and deduplicated downstream); " +
			"set sync.lock.backend: etcd for a strong lock")
	default:
		log.Info("sync lock: Redis ("+cfg.Redis.Mode+")", zap.String("redis_mode", cfg.Redis.Mode))
	}
	p.Syncer, err = producer.NewSyncer(producer.SyncerConfigFrom(cfg), producer.SyncerDeps{
		Source:    producer.WeComSource{Client: wc},
		Locker:    locker,
		State:     cursors,
		Publisher: media.KeepingPublisher(p.kp, p.media),
		IDs:       &p.ids,
	}, producer.WithLogger(log), producer.WithRegisterer(reg), producer.WithStatus(state, producer.StatusInterval))
	if err != nil {
		return err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t0 := time.Now()
		if err := p.kp.WaitReady(ctx); err != nil {
			log.Info("sync not started: kafka producer not ready", zap.Error(err))
			return
		}
		log.Info("kafka producer warmed up; starting the sync", zap.Duration("waited", time.Since(t0)))
		p.Syncer.Start()
	}()
	return nil
}

// startCallback serves WeChat's callback, which triggers a sync of the
// account it names.
func (p *Producer) startCallback(cfg *config.Producer, base *daemon.Base, opts ...wecom.HandlerOption) error {
	log, prefix := base.Log, cfg.Redis.KeyPrefix
	crypto, err := wecom.NewCrypto(cfg.Callback.Token, cfg.Callback.EncodingAESKey, cfg.WeCom.CorpID)
	if err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	hcfg := wecom.CallbackConfig{MaxBodyBytes: int64(cfg.Callback.MaxBodyBytes), TimestampWindow: cfg.Callback.TimestampWindow,
		ReplayWindow: cfg.Callback.ReplayWindow}
	if base.Ops != nil {
		base.Ops.AddDetail("sync", p.Syncer.Failing)
	}
	trigger := func(_ context.Context, openKfID, token string) {
		if err := p.Syncer.Trigger(openKfID, token); err != nil {
			// Answered "success" anyway: the safety sync picks it up.
			log.Warn("sync trigger dropped", zap.String("open_kfid", openKfID), zap.Error(err))
		}
	}
	h := wecom.NewCallbackHandler(hcfg, crypto, wecom.NewRedisReplayCache(base.Redis, prefix), trigger,
		append(opts, wecom.WithHandlerLogger(log), wecom.WithHandlerRegisterer(base.Registry))...)
	mux := http.NewServeMux()
	mux.Handle(cfg.Callback.Path, h)
	ln, err := net.Listen("tcp", cfg.Callback.Addr)
	if err != nil {
		return fmt.Errorf("callback listen %s: %w", cfg.Callback.Addr, err)
	}
	p.CallbackURL = "http://" + ln.Addr().String() + cfg.Callback.Path
	p.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := p.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("callback server", zap.Error(err))
		}
	}()
	log.Info("callback listening", zap.String("url", p.CallbackURL))
	return nil
}

// Close stops the callback endpoint, then the sync loop (a page in flight
// finishes or is abandoned without moving the cursor), flushes the Kafka
// producer and releases the worker ID.
func (p *Producer) Close(ctx context.Context) error {
	var errs []error
	if p.http != nil {
		errs = append(errs, p.http.Shutdown(ctx))
	}
	if p.Syncer != nil {
		errs = append(errs, p.Syncer.Stop(ctx))
	}
	if p.kp != nil {
		errs = append(errs, p.kp.Close(ctx))
	}
	errs = append(errs, p.media.Stop(ctx))
	p.cancel()
	p.wg.Wait()
	if p.keeper != nil {
		errs = append(errs, p.keeper.Close(ctx))
	}
	return errors.Join(errs...)
}
