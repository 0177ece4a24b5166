package media

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/overload"
	"github.com/kfpipe/kfpipe/kf"
)

// FromConfig builds the keeper a daemon's media and wecom sections
// describe, downloading through WeChat with the access tokens of tokens
// (the Redis cache every process of the corp shares). It returns nil with
// media.store: off, or without wecom.corp_id and wecom.secret (the
// consumer's are optional: kfpipe.OpenMedia then says ErrNoMediaStore).
func FromConfig(ctx context.Context, m config.Media, w config.WeCom, tokens kf.TokenCache, log *zap.Logger,
	reg prometheus.Registerer) (*Keeper, error) {
	if m.Store == "off" || w.CorpID == "" || w.Secret == "" {
		log.Info("media keeping off", zap.String("media.store", m.Store), zap.Bool("wecom_credentials", w.CorpID != "" && w.Secret != ""))
		return nil, nil
	}
	var store Store
	var err error
	switch m.Store {
	case "dir":
		store, err = NewDirStore(m.Dir)
	case "s3":
		store, err = NewS3Store(ctx, S3Config{Endpoint: m.S3.Endpoint, Bucket: m.S3.Bucket, Region: m.S3.Region,
			AccessKey: m.S3.AccessKey, SecretKey: m.S3.SecretKey, Prefix: m.S3.Prefix, TLS: m.S3.TLS})
	default:
		err = fmt.Errorf("media.store must be dir, s3 or off, got %q", m.Store)
	}
	if err != nil {
		return nil, err
	}
	kc, err := kf.New(kf.Config{BaseURL: w.BaseURL, CorpID: w.CorpID, Secret: w.Secret, Timeout: w.RequestTimeout, Tokens: tokens})
	if err != nil {
		return nil, fmt.Errorf("media: %w", err)
	}
	log.Info("media keeping on", zap.String("media.store", m.Store), zap.Int("media.max_bytes", m.MaxBytes))
	return NewKeeper(store, kc, KeeperConfig{CorpID: w.CorpID, MaxBytes: int64(m.MaxBytes), Retries: m.Retries,
		RetryBase: m.RetryBase, Workers: m.Workers, QueueSize: m.QueueSize}, WithLogger(log), WithRegisterer(reg),
		WithLimiter(overload.New(overload.DefaultConfig(MaxDownloadsInFlight), nil))), nil
}
