package once

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Environment variables the lazily built default client reads.
const (
	EnvRedisAddr      = "KFPIPE_REDIS_ADDR"
	EnvRedisKeyPrefix = "KFPIPE_REDIS_KEY_PREFIX"
)

type holder struct{ c Idempotent }

var (
	defaultClient  atomic.Pointer[holder]
	defaultOnce    sync.Once
	defaultInitErr error
)

// SetDefault makes c the client of the package-level Do and Execute. It
// wins over the environment, also after the default was built from it.
func SetDefault(c Idempotent) {
	if c == nil {
		defaultClient.Store(nil)
		return
	}
	defaultClient.Store(&holder{c: c})
}

// Default returns the package-level client: the one given to SetDefault,
// else one built on first use from KFPIPE_REDIS_ADDR and
// KFPIPE_REDIS_KEY_PREFIX (default "kfpipe:"). A failed build is not retried.
func Default() (Idempotent, error) {
	if h := defaultClient.Load(); h != nil {
		return h.c, nil
	}
	defaultOnce.Do(func() {
		addr := os.Getenv(EnvRedisAddr)
		if addr == "" {
			defaultInitErr = ErrNoDefault
			return
		}
		prefix, ok := os.LookupEnv(EnvRedisKeyPrefix)
		if !ok {
			prefix = "kfpipe:"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := New(ctx, filepath.Base(os.Args[0]), Config{Addr: addr, KeyPrefix: prefix})
		if err != nil {
			defaultInitErr = err
			return
		}
		defaultClient.CompareAndSwap(nil, &holder{c: c})
	})
	if h := defaultClient.Load(); h != nil {
		return h.c, nil
	}
	return nil, defaultInitErr
}

// Do runs Default().Do.
func Do(ctx context.Context, key string, ttl time.Duration, f func(ctx context.Context) error) error {
	c, err := Default()
	if err != nil {
		return err
	}
	return c.Do(ctx, key, ttl, f)
}

// Execute runs Default().Execute.
func Execute(ctx context.Context, key string, ttl time.Duration, callback func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	c, err := Default()
	if err != nil {
		return nil, err
	}
	return c.Execute(ctx, key, ttl, callback)
}
