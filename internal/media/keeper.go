package media

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/overload"
	"github.com/kfpipe/kfpipe/kf"
)

// Fetcher downloads a media_id from WeChat (kf.Client).
type Fetcher interface {
	GetMedia(ctx context.Context, mediaID string) (*kf.Media, error)
}

// KeeperConfig is the keeper's part of the media section.
type KeeperConfig struct {
	// CorpID is the corp whose media is kept: the first part of a key.
	CorpID string
	// MaxBytes bounds an object (media.max_bytes): a larger one is refused
	// with RefusedTooLarge and only the refusal is stored.
	MaxBytes int64
	// Retries is how many times a failed download or store write is tried
	// again within one Keep (media.retries), RetryBase the first wait,
	// doubled each time (media.retry_base).
	Retries   int
	RetryBase time.Duration
	// Workers and QueueSize size kf-producer's stage (media.workers,
	// media.queue_size).
	Workers, QueueSize int
}

// Keeper copies inbound media from WeChat to a Store.
type Keeper struct {
	store Store
	fetch Fetcher
	cfg   KeeperConfig
	log   *zap.Logger
	m     *metrics
	// limit bounds the downloads in flight and is cut by WeChat's
	// throttles (nil: none; WithLimiter).
	limit *overload.Limiter

	queue   chan Ref
	startMu sync.Mutex
	stop    chan struct{}
	wg      sync.WaitGroup
}

// KeeperOption configures a Keeper.
type KeeperOption func(*Keeper)

// WithLogger sets the keeper's logger (default: none).
func WithLogger(l *zap.Logger) KeeperOption { return func(k *Keeper) { k.log = l } }

// WithRegisterer registers the kfpipe_media_* metrics on reg.
func WithRegisterer(reg prometheus.Registerer) KeeperOption {
	return func(k *Keeper) { k.m = newMetrics(reg) }
}

// WithLimiter bounds the downloads in flight from WeChat with l, the
// adaptive limit of package overload: WeChat's throttles (45009, 45011,
// 45033) cut it, so a throttled media/get gets fewer downloads at once,
// not a retry from each. A download beyond it waits for a slot.
func WithLimiter(l *overload.Limiter) KeeperOption { return func(k *Keeper) { k.limit = l } }

// MaxDownloadsInFlight bounds the downloads a process has in flight from
// WeChat at once (the adaptive limit starts at 10 and moves between 1 and
// it).
const MaxDownloadsInFlight = 64

// NewKeeper returns a keeper that downloads with fetch into store.
func NewKeeper(store Store, fetch Fetcher, cfg KeeperConfig, opts ...KeeperOption) *Keeper {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 200 * time.Millisecond
	}
	k := &Keeper{store: store, fetch: fetch, cfg: cfg, log: zap.NewNop()}
	for _, o := range opts {
		o(k)
	}
	if k.m == nil {
		k.m = newMetrics(nil)
	}
	return k
}

// RefOf returns the media of m (ok false when m carries none).
func (k *Keeper) RefOf(m *chatmsg.ChatMessage) (Ref, bool) { return RefOf(k.cfg.CorpID, m) }

// Ref returns the Ref of a message of the keeper's corp.
func (k *Keeper) Ref(openKfID, msgID, msgType, mediaID string) Ref {
	return Ref{CorpID: k.cfg.CorpID, OpenKfID: openKfID, MsgID: msgID, MsgType: msgType, MediaID: mediaID}
}

// Store returns the keeper's store.
func (k *Keeper) Store() Store { return k.store }

// Keep makes sure ref's media is in the store and returns its info: a
// stored object (or refusal) is left as it is; otherwise the media is
// downloaded and stored, with up to Retries retries of a failure that may
// pass (a transport error, WeChat busy, the store unreachable). stage
// labels the metrics (producer, consumer). ErrExpired: WeChat no longer
// has it and it was never kept; a refusal is stored and returned in
// Info.Refused, with a nil error.
func (k *Keeper) Keep(ctx context.Context, stage string, ref Ref) (Info, error) {
	key, err := ref.Key()
	if err != nil {
		return Info{}, err
	}
	wait := k.cfg.RetryBase
	for try := 0; ; try++ {
		info, reason, err := k.keepOnce(ctx, key, ref)
		switch {
		case err == nil:
			k.m.kept.WithLabelValues(stage, reason).Inc()
			if reason != "already" {
				k.log.Info("media kept", zap.String("stage", stage), zap.String("key", key),
					zap.String("result", reason), zap.Int64("bytes", info.Size), zap.String("refused", info.Refused))
			}
			return info, nil
		case errors.Is(err, ErrExpired):
			k.m.kept.WithLabelValues(stage, "expired").Inc()
			k.log.Warn("media expired before it was kept", zap.String("stage", stage), zap.String("key", key),
				zap.String("media_id", ref.MediaID))
			return Info{}, err
		}
		k.m.failures.WithLabelValues(stage, reason).Inc()
		if try >= k.cfg.Retries || ctx.Err() != nil {
			k.m.kept.WithLabelValues(stage, "failed").Inc()
			k.log.Warn("media not kept", zap.String("stage", stage), zap.String("key", key),
				zap.String("reason", reason), zap.Int("tries", try+1), zap.Error(err))
			return Info{}, fmt.Errorf("media %s: %s: %w", key, reason, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait *= 2
	}
}

// keepOnce is one attempt of Keep: the result label (stored, refused,
// already) or, with an error, the failure's reason label.
func (k *Keeper) keepOnce(ctx context.Context, key string, ref Ref) (Info, string, error) {
	if info, err := k.store.Stat(ctx, key); err == nil {
		return info, "already", nil
	} else if !errors.Is(err, ErrNotFound) {
		return Info{}, "store", err
	}
	// The download, from media/get to the store's write, in a slot under
	// the downloads' limit: a throttle cuts it, an object kept is a
	// latency sample.
	start, ok := k.limit.Acquire(ctx)
	if !ok {
		return Info{}, "fetch", ctx.Err()
	}
	outcome := overload.Ignored
	defer func() { k.limit.Release(start, outcome) }()
	m, err := k.fetch.GetMedia(ctx, ref.MediaID)
	if err != nil {
		if kf.IsThrottled(err) {
			outcome = overload.Dropped
		}
		if kf.IsMediaExpired(err) {
			return Info{}, "expired", ErrExpired
		}
		var e *kf.Error
		if errors.As(err, &e) {
			return Info{}, "errcode_" + strconv.Itoa(e.Code), err
		}
		return Info{}, "fetch", err
	}
	defer m.Body.Close()
	info := Info{ContentType: m.ContentType, FileName: m.FileName, MsgType: ref.MsgType, MediaID: ref.MediaID,
		Kept: time.Now().UTC()}
	var body io.Reader = m.Body
	size := m.Size
	if k.cfg.MaxBytes > 0 {
		if size > k.cfg.MaxBytes {
			return k.refuse(ctx, key, info, size)
		}
		if size < 0 {
			// No length announced: read up to the bound to learn it.
			b, err := io.ReadAll(io.LimitReader(m.Body, k.cfg.MaxBytes+1))
			if err != nil {
				return Info{}, "fetch", err
			}
			if int64(len(b)) > k.cfg.MaxBytes {
				return k.refuse(ctx, key, info, -1)
			}
			body, size = bytes.NewReader(b), int64(len(b))
		}
	}
	cr := &countingReader{r: body}
	if err := k.store.Put(ctx, key, cr, size, info); err != nil {
		if cr.err != nil {
			return Info{}, "fetch", cr.err // the download broke, not the store
		}
		return Info{}, "store", err
	}
	k.m.bytes.Add(float64(cr.n))
	info.Size = cr.n
	outcome = overload.Success
	return info, "stored", nil
}

// refuse stores the refusal of an object too large to keep.
func (k *Keeper) refuse(ctx context.Context, key string, info Info, size int64) (Info, string, error) {
	if size >= 0 {
		info.Refused = fmt.Sprintf("%s: %d bytes, media.max_bytes is %d", RefusedTooLarge, size, k.cfg.MaxBytes)
	} else {
		info.Refused = fmt.Sprintf("%s: more than media.max_bytes %d", RefusedTooLarge, k.cfg.MaxBytes)
	}
	if err := k.store.Put(ctx, key, bytes.NewReader(nil), 0, info); err != nil {
		return Info{}, "store", err
	}
	k.m.refused.WithLabelValues(RefusedTooLarge).Inc()
	return info, "refused", nil
}

// Open returns ref's object from the store: ErrRefused (with the reason)
// for a refused one, ErrNotFound when it was never kept.
func (k *Keeper) Open(ctx context.Context, ref Ref) (io.ReadCloser, Info, error) {
	key, err := ref.Key()
	if err != nil {
		return nil, Info{}, err
	}
	rc, info, err := k.store.Open(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	if info.Refused != "" {
		rc.Close()
		return nil, info, fmt.Errorf("%w: %s", ErrRefused, info.Refused)
	}
	return rc, info, nil
}

// countingReader counts what was read and keeps the reader's error.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}
