package once

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
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

// DoneValue returns the value stored with key's done marker under prefix
// (ok false when key is not done): what the call's result was.
func DoneValue(ctx context.Context, rdb redis.UniversalClient, prefix, key string) (value string, ok bool, err error) {
	v, err := rdb.Get(ctx, prefix+key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("once: reading a done marker: %w", err)
	}
	value, ok = strings.CutPrefix(v, donePrefix)
	return value, ok, nil
}

// UserItem is a message of the leases store: its idempotency key and
// send time (unix seconds; 0 when unknown), which picks the day set.
type UserItem struct {
	Key      string
	SendTime int64
}

// UserDone is DoneUsers' question: is user's message key (sent at
// SendTime) among the messages recorded by Users?
type UserDone struct {
	User string
	UserItem
}

// DoneUsers reports, for each query, whether Users recorded the message
// as handled (prefix as in UsersConfig.KeyPrefix). It only reads: one
// SMISMEMBER per user and day, pipelined a thousand at a time.
func DoneUsers(ctx context.Context, rdb redis.UniversalClient, prefix string, qs []UserDone) ([]bool, error) {
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
					members[n] = Digest(qs[i].Key)
				}
				cmds[j] = p.SMIsMember(ctx, s.key, members...)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("once: reading users' done marks: %w", err)
		}
		for j, s := range part {
			for n, ok := range cmds[j].Val() {
				out[s.idx[n]] = ok
			}
		}
	}
	return out, nil
}

// Digest is the 64-bit digest under which the leases store recorded a
// message's idempotency key (FNV-1a), read while its keys live.
func Digest(key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64())
}

// dayOf is the leases store's day bucket of a send time (unix seconds; 0:
// unknown).
func dayOf(sendTime int64) int64 {
	if sendTime <= 0 {
		return 0
	}
	return sendTime / 86400
}
