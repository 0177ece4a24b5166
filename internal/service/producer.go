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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/idgen"
	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Producer is a running kf-producer.
type Producer struct {
	Syncer      *producer.Syncer
	CallbackURL string

	log      *zap.Logger
	kp       *producer.KafkaProducer
	etcd     *clientv3.Client
	http     *http.Server
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	newAlloc func() (idgen.Allocator, error)
	newGen   func(workerID int) (*idgen.Generator, error)
	ids      generator

	allocMu  sync.Mutex
	alloc    idgen.Allocator
	allocErr error
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
	log, reg := base.Log, base.Registry
	prefix := cfg.Redis.KeyPrefix
	p := &Producer{log: log}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	fail := func(err error) (*Producer, error) {
		_ = p.Close(context.Background())
		return nil, err
	}

	// Worker ID: duplicate IDs would collide Snowflake IDs, so losing the
	// allocation stops the sync and makes the process unready.
	acfg := idgen.AllocatorFromConfig(cfg.IDGen, prefix, nodeName())
	var err error
	if cfg.IDGen.Allocator.Backend == "etcd" {
		p.etcd, err = clientv3.New(clientv3.Config{Endpoints: cfg.IDGen.Allocator.EtcdEndpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			return fail(fmt.Errorf("etcd: %w", err))
		}
	}
	// Metrics are registered by the first allocator and generator only: a
	// re-allocation must not register them twice.
	idOpts := []idgen.Option{idgen.WithLogger(log), idgen.WithRegisterer(reg)}
	p.newAlloc = func() (idgen.Allocator, error) {
		defer func() { idOpts = []idgen.Option{idgen.WithLogger(log)} }()
		if p.etcd != nil {
			return idgen.NewEtcdAllocator(p.etcd, acfg, idOpts...)
		}
		return idgen.NewRedisAllocator(base.Redis, acfg, idOpts...)
	}
	genOpts := []idgen.Option{idgen.WithRegisterer(reg)}
	p.newGen = func(workerID int) (*idgen.Generator, error) {
		defer func() { genOpts = nil }()
		return idgen.New(idgen.SnowflakeFromConfig(cfg.IDGen, workerID), genOpts...)
	}
	if err := p.allocate(ctx); err != nil {
		return fail(err)
	}

	p.kp, err = producer.NewKafkaProducer(cfg.Kafka, reg, log)
	if err != nil {
		return fail(err)
	}
	wc, err := wecom.NewClient(wecom.ClientConfig{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout}, wecom.NewRedisTokenCache(base.Redis, prefix),
		wecom.WithClientLogger(log), wecom.WithClientRegisterer(reg))
	if err != nil {
		return fail(err)
	}
	p.Syncer, err = producer.NewSyncer(producer.SyncerConfigFrom(cfg), producer.SyncerDeps{
		Source:    producer.WeComSource{Client: wc},
		Locker:    producer.LockAdapter{Locker: lock.New(base.Redis, "", lock.WithLogger(log), lock.WithRegisterer(reg))},
		State:     producer.NewRedisState(base.Redis, prefix),
		Publisher: p.kp,
		IDs:       &p.ids,
	}, producer.WithLogger(log), producer.WithRegisterer(reg))
	if err != nil {
		return fail(err)
	}
	p.Syncer.Start()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.keepAlive(rctx)
	}()
	base.Ops.AddCheck("sync", func(context.Context) error { return p.Syncer.Healthy() })
	base.Ops.AddCheck("worker_id", func(context.Context) error {
		p.allocMu.Lock()
		defer p.allocMu.Unlock()
		return p.allocErr
	})
	base.Ops.AddCheck("kafka_producer", p.kp.Ready)

	crypto, err := wecom.NewCrypto(cfg.Callback.Token, cfg.Callback.EncodingAESKey, cfg.WeCom.CorpID)
	if err != nil {
		return fail(fmt.Errorf("callback: %w", err))
	}
	hcfg := wecom.CallbackConfig{MaxBodyBytes: int64(cfg.Callback.MaxBodyBytes), TimestampWindow: cfg.Callback.TimestampWindow,
		ReplayWindow: cfg.Callback.ReplayWindow}
	if err := hcfg.Validate(); err != nil {
		return fail(fmt.Errorf("callback: %w", err))
	}
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
		wecom.WithHandlerLogger(log), wecom.WithHandlerRegisterer(reg))
	mux := http.NewServeMux()
	mux.Handle(cfg.Callback.Path, h)
	ln, err := net.Listen("tcp", cfg.Callback.Addr)
	if err != nil {
		return fail(fmt.Errorf("callback listen %s: %w", cfg.Callback.Addr, err))
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
	return p, nil
}

// allocate takes a worker ID and installs a generator for it.
func (p *Producer) allocate(ctx context.Context) error {
	alloc, err := p.newAlloc()
	if err != nil {
		return fmt.Errorf("worker-id allocator: %w", err)
	}
	workerID, err := alloc.Allocate(ctx)
	if err != nil {
		return fmt.Errorf("allocate worker id: %w", err)
	}
	gen, err := p.newGen(workerID)
	if err != nil {
		_ = alloc.Stop(ctx)
		return err
	}
	p.ids.p.Store(gen)
	p.allocMu.Lock()
	p.alloc, p.allocErr = alloc, nil
	p.allocMu.Unlock()
	p.log.Info("worker id allocated", zap.Int("worker_id", workerID))
	return nil
}

// keepAlive renews the worker ID. When it is lost (expired during a Redis
// or etcd outage, or taken over), the sync pauses — two producers with one
// worker ID would collide Snowflake IDs — and a new ID is allocated as soon
// as the store answers again; then the sync resumes.
func (p *Producer) keepAlive(ctx context.Context) {
	for {
		p.allocMu.Lock()
		alloc := p.alloc
		p.allocMu.Unlock()
		var lost error
		for err := range alloc.KeepAlive(ctx) {
			if errors.Is(err, idgen.ErrKeyStolen) || errors.Is(err, idgen.ErrLeaseExpired) {
				lost = err
				break
			}
			p.log.Warn("worker id keep-alive", zap.Error(err))
		}
		if lost == nil || ctx.Err() != nil {
			return
		}
		p.allocMu.Lock()
		p.allocErr = fmt.Errorf("worker id lost: %w", lost)
		p.allocMu.Unlock()
		p.log.Error("worker id lost; sync paused until a new one is allocated", zap.Error(lost))
		p.Syncer.Pause(lost)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = alloc.Stop(sctx) // frees the key if it is still ours; usually it is gone
		cancel()
		for wait := time.Second; ; wait = min(2*wait, 5*time.Second) {
			err := p.allocate(ctx)
			if err == nil {
				p.Syncer.Resume()
				break
			}
			p.log.Warn("worker id re-allocation failed; retrying", zap.Error(err), zap.Duration("in", wait))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
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
	p.cancel()
	p.wg.Wait()
	p.allocMu.Lock()
	alloc := p.alloc
	p.allocMu.Unlock()
	if alloc != nil {
		if err := alloc.Stop(ctx); err != nil && !errors.Is(err, idgen.ErrNotAllocated) && !errors.Is(err, idgen.ErrStopped) {
			errs = append(errs, err)
		}
	}
	if p.etcd != nil {
		errs = append(errs, p.etcd.Close())
	}
	return errors.Join(errs...)
}
