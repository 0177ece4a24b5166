package idgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// AfterClock is the part of a clock a Keeper waits with.
type AfterClock interface {
	After(d time.Duration) <-chan time.Time
}

type realAfter struct{}

func (realAfter) After(d time.Duration) <-chan time.Time { return time.After(d) }

// KeeperConfig configures a Keeper. NewAllocator and Install are required.
type KeeperConfig struct {
	// NewAllocator returns a fresh allocator for every allocation: an
	// allocator cannot be used again after Stop.
	NewAllocator func() (Allocator, error)
	// Install is called with every newly allocated worker ID before the
	// Keeper reports it held; an error frees the ID and fails the
	// allocation (the producer builds its Snowflake generator here).
	Install func(workerID int) error
	// Lost is called when the held ID is lost, before re-allocation
	// starts: IDs made with it must not be issued any more (the producer
	// pauses its sync). Optional.
	Lost func(err error)
	// Regained is called after a lost ID was replaced by a new one
	// (the producer resumes its sync). Optional.
	Regained func()
	// RetryMin and RetryMax bound the doubling wait between failed
	// re-allocations (defaults 1 s and 5 s).
	RetryMin, RetryMax time.Duration
	// StopTimeout bounds freeing a lost ID's key (default 5 s).
	StopTimeout time.Duration
	// Clock times the waits between re-allocations (default: real time).
	Clock AfterClock
	// Logger defaults to no logging.
	Logger *zap.Logger
}

// Keeper holds a worker ID for the life of a process. Allocate takes the
// first one; Start renews it in the background. When it is lost (expired
// during a Redis or etcd outage, or taken over) the Keeper tells Lost —
// two processes with one worker ID would collide Snowflake IDs — and
// allocates a new one as soon as the store answers again, then tells
// Regained. Close stops the renewal, waits for it and frees the ID.
type Keeper struct {
	cfg KeeperConfig
	log *zap.Logger

	mu    sync.Mutex
	alloc Allocator
	err   error // why no ID is held, nil while one is

	cancel context.CancelFunc
	done   chan struct{}
}

// NewKeeper returns a Keeper that holds no ID yet.
func NewKeeper(cfg KeeperConfig) (*Keeper, error) {
	if cfg.NewAllocator == nil || cfg.Install == nil {
		return nil, errors.New("idgen: keeper needs NewAllocator and Install")
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(5*time.Second, cfg.RetryMin)
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = realAfter{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Keeper{cfg: cfg, log: cfg.Logger, err: ErrNotAllocated}, nil
}

// Allocate takes a worker ID and installs it.
func (k *Keeper) Allocate(ctx context.Context) error {
	alloc, err := k.cfg.NewAllocator()
	if err != nil {
		return fmt.Errorf("worker-id allocator: %w", err)
	}
	workerID, err := alloc.Allocate(ctx)
	if err != nil {
		return fmt.Errorf("allocate worker id: %w", err)
	}
	if err := k.cfg.Install(workerID); err != nil {
		_ = alloc.Stop(ctx)
		return err
	}
	k.mu.Lock()
	k.alloc, k.err = alloc, nil
	k.mu.Unlock()
	k.log.Info("worker id allocated", zap.Int("worker_id", workerID))
	return nil
}

// Err is nil while a worker ID is held, else why not (readiness).
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Start renews the held ID in a goroutine until ctx ends or Close; call it
// once, after a successful Allocate.
func (k *Keeper) Start(ctx context.Context) {
	ctx, k.cancel = context.WithCancel(ctx)
	k.done = make(chan struct{})
	go func() {
		defer close(k.done)
		k.run(ctx)
	}()
}

func (k *Keeper) run(ctx context.Context) {
	for {
		k.mu.Lock()
		alloc := k.alloc
		k.mu.Unlock()
		var lost error
		for err := range alloc.KeepAlive(ctx) {
			if errors.Is(err, ErrKeyStolen) || errors.Is(err, ErrLeaseExpired) {
				lost = err
				break
			}
			k.log.Warn("worker id keep-alive", zap.Error(err))
		}
		if lost == nil || ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		k.err = fmt.Errorf("worker id lost: %w", lost)
		k.mu.Unlock()
		k.log.Error("worker id lost; paused until a new one is allocated", zap.Error(lost))
		if k.cfg.Lost != nil {
			k.cfg.Lost(lost)
		}
		sctx, cancel := context.WithTimeout(ctx, k.cfg.StopTimeout)
		_ = alloc.Stop(sctx) // frees the key if it is still ours; usually it is gone
		cancel()
		for wait := k.cfg.RetryMin; ; wait = min(2*wait, k.cfg.RetryMax) {
			err := k.Allocate(ctx)
			if err == nil {
				if k.cfg.Regained != nil {
					k.cfg.Regained()
				}
				break
			}
			k.log.Warn("worker id re-allocation failed; retrying", zap.Error(err), zap.Duration("in", wait))
			select {
			case <-ctx.Done():
				return
			case <-k.cfg.Clock.After(wait):
			}
		}
	}
}

// Close stops the renewal, waits for it, and frees the held ID. A Keeper
// that holds none (never allocated, or lost) returns nil.
func (k *Keeper) Close(ctx context.Context) error {
	if k.cancel != nil {
		k.cancel()
		<-k.done
	}
	k.mu.Lock()
	alloc := k.alloc
	k.mu.Unlock()
	if alloc == nil {
		return nil
	}
	if err := alloc.Stop(ctx); err != nil && !errors.Is(err, ErrNotAllocated) && !errors.Is(err, ErrStopped) {
		return err
	}
	return nil
}
