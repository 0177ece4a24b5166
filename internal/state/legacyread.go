package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The read-only look-ups of the old stores' keys for the readers that are
// not the consumer (the admin, the DLQ's settling, the timeline, the
// replies), while the keys live after the switch to this store.

// legacyDonePrefix starts an old claims store's done marker ("p:" a claim
// in force).
const legacyDonePrefix = "d:"

// LegacyDone reports, for each key, whether the old claims store left a
// done marker under prefix+key (its prefix: "<redis prefix>dedup:" for
// messages, "<redis prefix>reply:" for replies): which calls had their
// effect before the switch to this store. It only reads (one MGET a thousand keys), claims nothing, and a
// key being processed right now is not done. The DLQ's batch retry uses
// it to skip letters whose message was processed after all.
func LegacyDone(ctx context.Context, rdb redis.UniversalClient, prefix string, keys []string) ([]bool, error) {
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
			return nil, fmt.Errorf("state: reading done markers: %w", err)
		}
		for i, v := range vals {
			s, ok := v.(string)
			out[lo+i] = ok && strings.HasPrefix(s, legacyDonePrefix)
		}
	}
	return out, nil
}

// LegacyDoneValue returns the value stored with key's done marker under prefix
// (ok false when key is not done): what the call's result was.
func LegacyDoneValue(ctx context.Context, rdb redis.UniversalClient, prefix, key string) (value string, ok bool, err error) {
	v, err := rdb.Get(ctx, prefix+key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("state: reading a done marker: %w", err)
	}
	value, ok = strings.CutPrefix(v, legacyDonePrefix)
	return value, ok, nil
}

// LegacyDoneUsers reports, for each query, whether the old leases store recorded the message
// as handled (prefix as in UsersConfig.KeyPrefix). It only reads: one
// SMISMEMBER per user and day, pipelined a thousand at a time.
func LegacyDoneUsers(ctx context.Context, rdb redis.UniversalClient, prefix string, qs []Item) ([]bool, error) {
	out := make([]bool, len(qs))
	type set struct {
		key string
		idx []int
	}
	var sets []*set
	index := map[string]*set{}
	for i, q := range qs {
		if q.User == "" || q.Key == "" {
			continue
		}
		k := prefix + "u:D:" + q.User + ":" + strconv.FormatInt(dayOf(q.SendTime), 10)
		s := index[k]
		if s == nil {
			s = &set{key: k}
			index[k] = s
			sets = append(sets, s)
		}
		s.idx = append(s.idx, i)
	}
	const chunk = 1000
	for lo := 0; lo < len(sets); lo += chunk {
		part := sets[lo:min(lo+chunk, len(sets))]
		cmds := make([]*redis.BoolSliceCmd, len(part))
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, s := range part {
				members := make([]any, len(s.idx))
				for n, i := range s.idx {
					members[n] = fnvDigest(qs[i].Key)
				}
				cmds[j] = p.SMIsMember(ctx, s.key, members...)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("state: reading users' done marks: %w", err)
		}
		for j, s := range part {
			for n, ok := range cmds[j].Val() {
				out[s.idx[n]] = ok
			}
		}
	}
	return out, nil
}

// dayOf is the leases store's day bucket of a send time (unix seconds; 0:
// unknown).
func dayOf(sendTime int64) int64 {
	if sendTime <= 0 {
		return 0
	}
	return sendTime / 86400
}
