package once

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ExecuteJSON is Execute for a result that round-trips through JSON: the
// first caller's value is stored, and duplicates decode the stored value.
func ExecuteJSON[T any](ctx context.Context, c Idempotent, key string, ttl time.Duration, callback func(ctx context.Context) (T, error)) (T, error) {
	var out T
	raw, err := c.Execute(ctx, key, ttl, func(ctx context.Context) ([]byte, error) {
		v, err := callback(ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(v)
	})
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("once: decode stored result of %q: %w", key, err)
	}
	return out, nil
}
