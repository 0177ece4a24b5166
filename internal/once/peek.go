package once

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Done reports, for each key, whether a done marker is stored under
// prefix+key (prefix as in Config.KeyPrefix): which calls have had their
// effect. It only reads (one MGET a thousand keys), claims nothing, and a
// key being processed right now is not done. The DLQ's batch retry uses
// it to skip letters whose message was processed after all.
func Done(ctx context.Context, rdb redis.UniversalClient, prefix string, keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	const chunk = 1000
	for lo := 0; lo < len(keys); lo += chunk {
		hi := min(lo+chunk, len(keys))
		rkeys := make([]string, hi-lo)
		for i, k := range keys[lo:hi] {
			rkeys[i] = prefix + k
		}
		vals, err := rdb.MGet(ctx, rkeys...).Result()
		if err != nil {
			return nil, fmt.Errorf("once: reading done markers: %w", err)
		}
		for i, v := range vals {
			s, ok := v.(string)
			out[lo+i] = ok && strings.HasPrefix(s, donePrefix)
		}
	}
	return out, nil
}
