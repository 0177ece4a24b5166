package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// limitKey is the key of the handler limit a consumer group last saved.
func (s *Store) limitKey(name string) string { return s.cfg.KeyPrefix + "st:limit:{" + name + "}" }

// LoadLimit returns the handler limit last saved under name (a consumer
// group), 0 when none was saved or it expired.
func (s *Store) LoadLimit(ctx context.Context, name string) (int, error) {
	n, err := s.cfg.Client.Get(ctx, s.limitKey(name)).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("state: load the handler limit of %s: %w", name, err)
	}
	return n, nil
}

// SaveLimit saves n as name's handler limit for ttl.
func (s *Store) SaveLimit(ctx context.Context, name string, n int, ttl time.Duration) error {
	if err := s.cfg.Client.Set(ctx, s.limitKey(name), n, ttl).Err(); err != nil {
		return fmt.Errorf("state: save the handler limit of %s: %w", name, err)
	}
	return nil
}
