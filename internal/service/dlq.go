// Package service wires each daemon's parts together from its typed
// configuration. The cmd mains and the all-in-one demo both call it, so
// the demo runs exactly the code the daemons run.
package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/fleet"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/state"
)

// blockLookup adapts the rate-limit admin to the DLQ's BlockLookup, so a
// user_blocked retry waits until the block ends.
type blockLookup struct{ a *ratelimit.Admin }

func (b blockLookup) BlockedUntil(ctx context.Context, user string) (time.Time, bool, error) {
	s, err := b.a.Status(ctx, user)
	if err != nil || !s.Blocked {
		return time.Time{}, false, err
	}
	if s.Permanent {
		return time.Now().Add(100 * 365 * 24 * time.Hour), true, nil
	}
	return s.BlockedUntil, true, nil
}

// DLQ is a running dlq-consumer: the DLQ topic consumer feeding the Redis
// index, the delayed-retry scheduler and the admin API.
type DLQ struct {
	Index    *dlq.Index
	Admin    *ratelimit.Admin
	AdminURL string

	log       *zap.Logger
	producer  *dlq.Producer
	letters   *dlq.TopicLetters
	scheduler *dlq.Scheduler
	http      *http.Server
	admin     *console.Server
	lag       *kafka.Consumer // reads the schedule-consumers' committed offsets
	dlqLag    *kafka.Consumer // reads the dlq-consumers' own (the Kafka card)
	archive   *archive.Store  // nil: archive.dsn empty
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	runErr    error
}

// StartDLQ starts the dlq-consumer's parts on base's clients.
func StartDLQ(ctx context.Context, cfg *config.DLQConsumer, base *daemon.Base) (*DLQ, error) {
	opts := []dlq.Option{dlq.WithLogger(base.Log), dlq.WithRegisterer(base.Registry)}
	logDLQSettings(base.Log, cfg)
	prefix := cfg.Redis.KeyPrefix
	rlAdmin, err := ratelimit.NewAdmin(ratelimit.NewStore(base.Redis, prefix), cfg.RateLimit,
		append(rulesOption(cfg.RateLimit, base), ratelimit.WithLogger(base.Log))...)
	if err != nil {
		return nil, fmt.Errorf("rate-limit admin: %w", err)
	}
	opts = append(opts, dlq.WithBlockLookup(blockLookup{rlAdmin}))
	producer, err := dlq.NewProducer(dlq.ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ}, opts...)
	if err != nil {
		return nil, fmt.Errorf("dlq producer: %w", err)
	}
	// The index keeps summaries; whole letters are read back from the
	// DLQ topic.
	letters, err := dlq.NewTopicLetters(cfg.Kafka)
	if err != nil {
		_ = producer.Close(context.Background())
		return nil, err
	}
	// The index records purges, the scheduler sent retries, in the DLQ
	// topic, so a rebuild reproduces both.
	idx := dlq.NewIndex(base.Redis, prefix, append(opts, dlq.WithEventSink(producer), dlq.WithLetters(letters),
		dlq.WithMaxEntries(cfg.DLQIndex.MaxEntries))...)
	policy := dlq.NewPolicy(cfg.Recovery, opts...)
	sched, err := dlq.NewScheduler(dlq.SchedulerConfig{Kafka: cfg.Kafka, Recovery: cfg.Recovery, RateLimit: cfg.RateLimit, Prefix: prefix},
		base.Redis, idx, policy, append(opts, dlq.WithEventSink(producer))...)
	if err != nil {
		_ = producer.Close(context.Background())
		_ = letters.Close()
		return nil, fmt.Errorf("dlq scheduler: %w", err)
	}
	cons, err := dlq.NewConsumer(dlq.ConsumerConfig{Kafka: cfg.Kafka}, idx, policy, opts...)
	if err != nil {
		_ = sched.Close(context.Background())
		_ = producer.Close(context.Background())
		_ = letters.Close()
		return nil, fmt.Errorf("dlq consumer: %w", err)
	}
	store, err := openArchive(ctx, cfg)
	if err != nil {
		_ = sched.Close(context.Background())
		_ = producer.Close(context.Background())
		_ = letters.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d := &DLQ{Index: idx, Admin: rlAdmin, log: base.Log, producer: producer, letters: letters, scheduler: sched, cancel: cancel,
		archive: store}
	sched.Start()
	d.startArchiver(rctx, cfg, base.Registry)
	d.wg.Add(3)
	go func() {
		defer d.wg.Done()
		d.settleLoop(rctx, idx, sources.NewDLQStore(idx, base.Redis, prefix))
	}()
	go func() {
		defer d.wg.Done()
		if err := cons.Run(rctx); err != nil {
			d.log.Error("dlq consumer stopped", zap.Error(err))
			d.runErr = err
		}
	}()
	go func() {
		defer d.wg.Done()
		d.purgeLoop(rctx, idx)
	}()
	if err := d.startAdmin(cfg, base); err != nil {
		_ = d.Close(context.Background())
		return nil, err
	}
	return d, nil
}

// Settling: how often the dlq-consumer asks the dedup store about retried
// letters, how many per round, how long after a retry it asks first, and
// how long it keeps asking.
const (
	settleEvery = 10 * time.Second
	settleBatch = 500
	settleAfter = 5 * time.Second
	settleWatch = time.Hour
)

// settleLoop marks retried letters done once the dedup store holds their
// message as processed (the letter says when its message is done); a
// letter whose message is still not done settleWatch after its retry is
// no longer asked about and stays retried. Each round reads the letters
// from the DLQ topic for their dedup keys.
func (d *DLQ) settleLoop(ctx context.Context, x *dlq.Index, s sources.DLQStore) {
	t := time.NewTicker(settleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n, err := settle(ctx, x, s, now); err != nil && ctx.Err() == nil {
				d.log.Warn("settling retried dead letters", zap.Error(err))
			} else if n > 0 {
				d.log.Debug("retried dead letters done", zap.Int("count", n))
			}
		}
	}
}

// settle is one round of settleLoop on the index x; it returns how many
// letters it marked done.
func settle(ctx context.Context, x *dlq.Index, s sources.DLQStore, now time.Time) (int, error) {
	es, err := x.Unsettled(ctx, now.Add(-settleAfter), settleBatch)
	if err != nil || len(es) == 0 {
		return 0, err
	}
	if err := x.Whole(ctx, es); err != nil {
		return 0, fmt.Errorf("reading letters for their dedup keys: %w", err)
	}
	qs := make([]state.Item, len(es))
	for i, e := range es {
		qs[i] = sources.UserDone(e.DeadLetter)
	}
	done, err := s.DoneKeys(ctx, qs)
	if err != nil {
		return 0, err
	}
	var marked []*dlq.Entry
	var stale []string
	for i, e := range es {
		switch {
		case done[i]:
			marked = append(marked, e)
		case e.RetriedAt != nil && now.Sub(*e.RetriedAt) > settleWatch:
			stale = append(stale, e.ID)
		}
	}
	if err := x.Unwatch(ctx, stale); err != nil {
		return 0, err
	}
	return x.MarkDone(ctx, marked)
}

// purgeLoop removes expired entries from every index once a minute.
func (d *DLQ) purgeLoop(ctx context.Context, idx *dlq.Index) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n, err := idx.PurgeExpired(ctx, now); err != nil {
				d.log.Warn("purge expired dead letters", zap.Error(err))
			} else if n > 0 {
				d.log.Info("purged expired dead letters", zap.Int("count", n))
			}
		}
	}
}

func (d *DLQ) startAdmin(cfg *config.DLQConsumer, base *daemon.Base) error {
	lag, err := kafkaclient.GroupReader(cfg.Kafka, cfg.Admin.ConsumerGroup)
	if err != nil {
		return fmt.Errorf("admin: consumer-group reader: %w", err)
	}
	dlqLag, err := kafkaclient.GroupReader(cfg.Kafka, cfg.Kafka.Consumer.GroupID)
	if err != nil {
		_ = lag.Close()
		return fmt.Errorf("admin: dlq consumer-group reader: %w", err)
	}
	h, err := sources.New(cfg, sources.Deps{Index: d.Index, Limits: d.Admin, Archive: d.archive, Redis: base.Redis,
		Kafka: base.Admin, Coord: base.Coord, Log: base.Log, Registry: base.Registry, Lag: lag, DLQLag: dlqLag})
	if err != nil {
		_ = lag.Close()
		_ = dlqLag.Close()
		return err
	}
	d.lag, d.dlqLag = lag, dlqLag
	ln, err := net.Listen("tcp", cfg.Admin.Addr)
	if err != nil {
		return fmt.Errorf("admin listen %s: %w", cfg.Admin.Addr, err)
	}
	d.admin = h
	d.AdminURL = "http://" + ln.Addr().String()
	d.http = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("admin server", zap.Error(err))
		}
	}()
	base.Log.Info("admin API listening", zap.String("url", d.AdminURL+"/admin/ui/"))
	if base.Fleet != nil {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		base.Fleet.Update(uctx, func(m *fleet.Member) { m.AdminAddr = ln.Addr().String() })
		cancel()
	}
	return nil
}

// Close stops the admin API, the scheduler and the consumer (which commits
// what it indexed), then flushes the DLQ producer.
func (d *DLQ) Close(ctx context.Context) error {
	var errs []error
	if d.http != nil {
		errs = append(errs, d.http.Shutdown(ctx))
	}
	if d.admin != nil {
		errs = append(errs, d.admin.Close())
	}
	if d.lag != nil {
		errs = append(errs, d.lag.Close())
	}
	if d.dlqLag != nil {
		errs = append(errs, d.dlqLag.Close())
	}
	errs = append(errs, d.scheduler.Close(ctx))
	d.cancel()
	d.wg.Wait()
	errs = append(errs, d.producer.Close(ctx), d.letters.Close(), d.runErr)
	if d.archive != nil {
		d.archive.Close()
	}
	return errors.Join(errs...)
}
