package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/coord"
)

// Where the rules override and the group assignments live with
// WithEtcdRules, in etcd's config center.
const (
	etcdRulesKey     = "ratelimit/rules"
	etcdGroupsPrefix = "ratelimit/groups/"
	etcdPrefix       = "ratelimit/"
)

// RulesBackend names where the Admin keeps the rules: "redis" or "etcd".
func (a *Admin) RulesBackend() string {
	if a.o.etcd != nil {
		return "etcd"
	}
	return "redis"
}

// RulesVersion returns the rules in force and their version, for
// SetRulesIf. Version 0 means the configured rules (never overridden, or
// the override was deleted in etcd).
func (a *Admin) RulesVersion(ctx context.Context) (map[string]config.RateGroup, int64, error) {
	if cc := a.o.etcd; cc != nil {
		g, v, err := coord.GetWithVersion[map[string]groupJSON](ctx, cc, etcdRulesKey)
		if errors.Is(err, coord.ErrNotFound) {
			return a.configured(), 0, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("load rate-limit rules from etcd: %w", err)
		}
		return fromJSONGroups(g), v, nil
	}
	var rules, ver *redis.StringCmd
	_, err := a.store.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		rules, ver = pipe.Get(ctx, a.store.rulesKey()), pipe.Get(ctx, a.store.rulesVersionKey())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("load rate-limit rules: %w", err)
	}
	v, _ := ver.Int64()
	if errors.Is(rules.Err(), redis.Nil) {
		return a.configured(), v, nil
	}
	var g map[string]groupJSON
	if err := json.Unmarshal([]byte(rules.Val()), &g); err != nil {
		return nil, 0, fmt.Errorf("%w: %s holds invalid JSON: %w", ErrInvalidRules, a.store.rulesKey(), err)
	}
	return fromJSONGroups(g), v, nil
}

func (a *Admin) configured() map[string]config.RateGroup {
	out := make(map[string]config.RateGroup, len(a.cfg.Groups))
	for n, g := range a.cfg.Groups {
		out[n] = g
	}
	return out
}

// setRulesScript replaces the rules only at the expected version.
// KEYS: rules, version; ARGV: expected version, rules JSON, channel, event.
// Returns {1, new version} or {0, current version}.
var setRulesScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur ~= tonumber(ARGV[1]) then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[2])
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {1, v}
`)

// SetRulesIf replaces the rules of every limiter (the whole group map,
// which must keep the default group) only if they are still at version —
// so two operators editing at once cannot overwrite each other unseen:
// the second gets a *RulesConflictError with the current version. It
// returns the new version. Invalid rules are refused naming the key.
func (a *Admin) SetRulesIf(ctx context.Context, groups map[string]config.RateGroup, version int64) (int64, error) {
	if err := validateGroups(groups, a.cfg.DefaultGroup); err != nil {
		return 0, err
	}
	if cc := a.o.etcd; cc != nil {
		v, err := coord.CompareAndSet(ctx, cc, etcdRulesKey, toJSONGroups(groups), version)
		var conflict *coord.VersionConflictError
		if errors.As(err, &conflict) {
			return 0, &RulesConflictError{Expected: version, Current: conflict.Current}
		}
		if err != nil {
			return 0, fmt.Errorf("write rate-limit rules to etcd: %w", err)
		}
		return v, nil
	}
	payload, err := json.Marshal(toJSONGroups(groups))
	if err != nil {
		return 0, err
	}
	ev, err := json.Marshal(event{Op: opRules})
	if err != nil {
		return 0, err
	}
	res, err := setRulesScript.Run(ctx, a.store.rdb, []string{a.store.rulesKey(), a.store.rulesVersionKey()},
		version, payload, a.store.channel(), ev).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("write rate-limit rules: %w", err)
	}
	if res[0] == 0 {
		return 0, &RulesConflictError{Expected: version, Current: res[1]}
	}
	return res[1], nil
}

// etcdGroup returns user's group assignment in etcd ("" when none).
func etcdGroup(ctx context.Context, cc *coord.ConfigCenter, user string) (string, error) {
	g, err := coord.Get[string](ctx, cc, etcdGroupsPrefix+user)
	if errors.Is(err, coord.ErrNotFound) {
		return "", nil
	}
	return g, err
}

// setEtcdGroup assigns user to group in etcd ("" removes the assignment).
func setEtcdGroup(ctx context.Context, cc *coord.ConfigCenter, user, group string) error {
	if group == "" {
		return cc.Delete(ctx, etcdGroupsPrefix+user)
	}
	_, err := coord.Set(ctx, cc, etcdGroupsPrefix+user, group)
	return err
}

// userOfGroupKey returns the user of a group-assignment key.
func userOfGroupKey(key string) (string, bool) {
	return strings.CutPrefix(key, etcdGroupsPrefix)
}
