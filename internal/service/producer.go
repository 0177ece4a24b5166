package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
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
	alloc    idgen.Allocator
	etcd     *clientv3.Client
	http     *http.Server
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	allocMu  sync.Mutex
	allocErr error
}

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
	switch cfg.IDGen.Allocator.Backend {
	case "etcd":
		p.etcd, err = clientv3.New(clientv3.Config{Endpoints: cfg.IDGen.Allocator.EtcdEndpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			return fail(fmt.Errorf("etcd: %w", err))
		}
		p.alloc, err = idgen.NewEtcdAllocator(p.etcd, acfg, idgen.WithLogger(log), idgen.WithRegisterer(reg))
	default:
		p.alloc, err = idgen.NewRedisAllocator(base.Redis, acfg, idgen.WithLogger(log), idgen.WithRegisterer(reg))
	}
	if err != nil {
		return fail(fmt.Errorf("worker-id allocator: %w", err))
	}
	workerID, err := p.alloc.Allocate(ctx)
	if err != nil {
		return fail(fmt.Errorf("allocate worker id: %w", err))
	}
	gen, err := idgen.New(idgen.SnowflakeFromConfig(cfg.IDGen, workerID), idgen.WithRegisterer(reg))
	if err != nil {
		return fail(err)
	}
	log.Info("worker id allocated", zap.Int("worker_id", workerID))

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
		IDs:       gen,
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

// keepAlive renews the worker ID; a fatal loss pauses the sync.
func (p *Producer) keepAlive(ctx context.Context) {
	for err := range p.alloc.KeepAlive(ctx) {
		if errors.Is(err, idgen.ErrKeyStolen) || errors.Is(err, idgen.ErrLeaseExpired) {
			p.allocMu.Lock()
			p.allocErr = fmt.Errorf("worker id lost: %w", err)
			p.allocMu.Unlock()
			p.log.Error("worker id lost; sync stopped (duplicate Snowflake IDs otherwise)", zap.Error(err))
			p.Syncer.Pause(err)
			return
		}
		p.log.Warn("worker id keep-alive", zap.Error(err))
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
	if p.alloc != nil {
		if err := p.alloc.Stop(ctx); err != nil && !errors.Is(err, idgen.ErrNotAllocated) && !errors.Is(err, idgen.ErrStopped) {
			errs = append(errs, err)
		}
	}
	if p.etcd != nil {
		errs = append(errs, p.etcd.Close())
	}
	return errors.Join(errs...)
}
