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
	u := Users{prefix: prefix + "u:"}
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
		k := u.doneKey(q.User, dayOf(q.SendTime))
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
