package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/redis/go-redis/v9"
)

// Admin is the operators' view of rate limiting (docs/operations.md, admin API),
// working on Redis so it acts on every node: each change is announced on
// rl:events and applied by every Limiter within a second. The dlq-consumer
// admin API serves it (and audits the writes).
type Admin struct {
	store *Store
	cfg   config.RateLimit
	o     options
}

// Status is what an operator sees of one user. Violation counts are not
// here: they live only in the memory of the node that owns the user's actor.
type Status struct {
	User         string    `json:"user"`
	Group        string    `json:"group"`
	Blocked      bool      `json:"blocked"`
	BlockedUntil time.Time `json:"blocked_until,omitzero"`
	Permanent    bool      `json:"permanent"`
	// Rule is the user's group's rule (none for the whitelist).
	Rule *config.RateGroup `json:"-"`
	// History are the automatic blocks inside progressive.history, oldest
	// first: the next one lasts longer for each.
	History []time.Time `json:"block_history,omitempty"`
}

// BlockedUser is one entry of ListBlocked.
type BlockedUser struct {
	User         string    `json:"user"`
	BlockedUntil time.Time `json:"blocked_until,omitzero"`
	Permanent    bool      `json:"permanent"`
}

// NewAdmin returns an Admin on store; cfg supplies the default group and
// the rules used while rl:rules holds no override.
func NewAdmin(store *Store, cfg config.RateLimit, opts ...Option) (*Admin, error) {
	if store == nil {
		return nil, errors.New("ratelimit admin: nil store")
	}
	if err := validateGroups(cfg.Groups, cfg.DefaultGroup); err != nil {
		return nil, err
	}
	return &Admin{store: store, cfg: cfg, o: buildOptions(opts)}, nil
}

// Status returns user's group and block.
func (a *Admin) Status(ctx context.Context, user string) (Status, error) {
	since := int64(-1)
	if a.cfg.Progressive.Enabled {
		since = a.o.clock.Now().Add(-a.cfg.Progressive.History).UnixMilli()
	}
	rec, err := a.store.load(ctx, user, since)
	if err != nil {
		return Status{}, err
	}
	if cc := a.o.etcd; cc != nil {
		if rec.group, err = etcdGroup(ctx, cc, user); err != nil {
			return Status{}, err
		}
	}
	st := Status{User: user, Group: rec.group}
	if st.Group == "" {
		st.Group = a.cfg.DefaultGroup
	}
	for _, ms := range rec.history {
		st.History = append(st.History, time.UnixMilli(ms).UTC())
	}
	if st.Group != GroupWhitelist {
		if groups, err := a.Rules(ctx); err == nil {
			if g, ok := groups[st.Group]; ok {
				st.Rule = &g
			}
		}
	}
	switch {
	case rec.blockedUntil == permanentMs:
		st.Blocked, st.Permanent = true, true
	case rec.blockedUntil > a.o.clock.Now().UnixMilli():
		st.Blocked, st.BlockedUntil = true, time.UnixMilli(rec.blockedUntil)
	}
	return st, nil
}

// Block blocks user for d from now, or permanently when d is 0. It replaces
// any current block, shorter or longer.
func (a *Admin) Block(ctx context.Context, user string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("block %s: negative duration %s", user, d)
	}
	if d > 0 && d < time.Millisecond {
		d = time.Millisecond
	}
	now := a.o.clock.Now().UnixMilli()
	w := blockWrite{user: user, until: permanentMs, nowMs: now, force: true}
	if d > 0 {
		w.until, w.ttlMs = now+d.Milliseconds(), d.Milliseconds()
	}
	if _, err := a.store.writeBlocks(ctx, []blockWrite{w}); err != nil {
		return fmt.Errorf("block %s: %w", user, err)
	}
	return nil
}

// Unblock ends user's block at once and clears its violation count.
func (a *Admin) Unblock(ctx context.Context, user string) error {
	return a.store.unblock(ctx, user)
}

// SetGroup puts user in group, which must exist in the current rules (or be
// the whitelist); the default group removes the user's own entry.
func (a *Admin) SetGroup(ctx context.Context, user, group string) error {
	groups, err := a.Rules(ctx)
	if err != nil {
		return err
	}
	if _, ok := groups[group]; !ok && group != GroupWhitelist {
		return fmt.Errorf("%w: %q", ErrUnknownGroup, group)
	}
	if cc := a.o.etcd; cc != nil {
		if group == a.cfg.DefaultGroup {
			group = ""
		}
		if err := setEtcdGroup(ctx, cc, user, group); err != nil {
			return fmt.Errorf("set group of %s: %w", user, err)
		}
		return nil
	}
	_, err = a.store.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		ev := event{Op: opGroup, User: user, Group: group}
		if group == a.cfg.DefaultGroup {
			pipe.Del(ctx, a.store.groupKey(user))
			ev.Group = ""
		} else {
			pipe.Set(ctx, a.store.groupKey(user), group, 0)
		}
		return a.store.publish(ctx, pipe, ev)
	})
	if err != nil {
		return fmt.Errorf("set group of %s: %w", user, err)
	}
	return nil
}

// Whitelist exempts user from rate limiting and ends its block: the
// operator's intent is that this user gets through.
func (a *Admin) Whitelist(ctx context.Context, user string) error {
	if cc := a.o.etcd; cc != nil {
		if err := setEtcdGroup(ctx, cc, user, GroupWhitelist); err != nil {
			return fmt.Errorf("whitelist %s: %w", user, err)
		}
		return a.store.unblock(ctx, user)
	}
	_, err := a.store.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, a.store.groupKey(user), GroupWhitelist, 0)
		pipe.Del(ctx, a.store.blockKey(user))
		pipe.ZRem(ctx, a.store.blockedKey(), user)
		if err := a.store.publish(ctx, pipe, event{Op: opGroup, User: user, Group: GroupWhitelist}); err != nil {
			return err
		}
		return a.store.publish(ctx, pipe, event{Op: opUnblock, User: user})
	})
	if err != nil {
		return fmt.Errorf("whitelist %s: %w", user, err)
	}
	return nil
}

// removeWhitelistScript moves a whitelisted user back to the default group.
// KEYS: group key; ARGV: channel, event.
var removeWhitelistScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= 'whitelist' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
`)

// RemoveWhitelist moves a whitelisted user back to the default group; it
// returns ErrNotWhitelisted for anyone else (their group is left alone).
func (a *Admin) RemoveWhitelist(ctx context.Context, user string) error {
	if cc := a.o.etcd; cc != nil {
		g, err := etcdGroup(ctx, cc, user)
		if err != nil {
			return fmt.Errorf("remove %s from whitelist: %w", user, err)
		}
		if g != GroupWhitelist {
			return fmt.Errorf("%w: %s", ErrNotWhitelisted, user)
		}
		return setEtcdGroup(ctx, cc, user, "")
	}
	payload, err := json.Marshal(event{Op: opGroup, User: user})
	if err != nil {
		return err
	}
	n, err := removeWhitelistScript.Run(ctx, a.store.rdb, []string{a.store.groupKey(user)}, a.store.channel(), string(payload)).Int()
	if err != nil {
		return fmt.Errorf("remove %s from whitelist: %w", user, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s", ErrNotWhitelisted, user)
	}
	return nil
}

// ListBlocked returns up to limit users blocked now, soonest-ending first and
// permanent blocks last, starting at cursor (0 for the first page); next is
// the cursor of the following page, 0 after the last. Entries whose block
// has ended are pruned first. A block ending between two pages shifts the
// listing by one; the list is for operators, not for bookkeeping.
func (a *Admin) ListBlocked(ctx context.Context, cursor, limit int) (users []BlockedUser, next int, err error) {
	if cursor < 0 || limit < 1 {
		return nil, 0, fmt.Errorf("list blocked: cursor must be >= 0 and limit >= 1, got %d, %d", cursor, limit)
	}
	now := a.o.clock.Now().UnixMilli()
	key := a.store.blockedKey()
	pipe := a.store.rdb.Pipeline()
	pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(now, 10))
	page := pipe.ZRangeWithScores(ctx, key, int64(cursor), int64(cursor+limit-1))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, 0, fmt.Errorf("list blocked: %w", err)
	}
	for _, z := range page.Val() {
		u := BlockedUser{User: fmt.Sprint(z.Member)}
		if math.IsInf(z.Score, 1) {
			u.Permanent = true
		} else {
			u.BlockedUntil = time.UnixMilli(int64(z.Score))
		}
		users = append(users, u)
	}
	if len(users) == limit {
		next = cursor + limit
	}
	return users, next, nil
}

// Rules returns the rules in force: the override (in Redis's rl:rules, or
// in etcd with WithEtcdRules), else the configured groups.
func (a *Admin) Rules(ctx context.Context) (map[string]config.RateGroup, error) {
	g, _, err := a.RulesVersion(ctx)
	return g, err
}

// SetRules replaces the rules of every limiter (the whole group map, which
// must keep the default group). The error names the bad key.
func (a *Admin) SetRules(ctx context.Context, groups map[string]config.RateGroup) error {
	if err := validateGroups(groups, a.cfg.DefaultGroup); err != nil {
		return err
	}
	if cc := a.o.etcd; cc != nil {
		_, err := coord.Set(ctx, cc, etcdRulesKey, toJSONGroups(groups))
		return err
	}
	payload, err := json.Marshal(toJSONGroups(groups))
	if err != nil {
		return err
	}
	return a.writeRules(ctx, func(pipe redis.Pipeliner) {
		pipe.Set(ctx, a.store.rulesKey(), payload, 0)
		pipe.Incr(ctx, a.store.rulesVersionKey())
	})
}

// ResetRules drops the override: every limiter returns to its configured groups.
func (a *Admin) ResetRules(ctx context.Context) error {
	if cc := a.o.etcd; cc != nil {
		return cc.Delete(ctx, etcdRulesKey)
	}
	return a.writeRules(ctx, func(pipe redis.Pipeliner) {
		pipe.Del(ctx, a.store.rulesKey())
		pipe.Incr(ctx, a.store.rulesVersionKey())
	})
}

func (a *Admin) writeRules(ctx context.Context, write func(redis.Pipeliner)) error {
	_, err := a.store.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		write(pipe)
		return a.store.publish(ctx, pipe, event{Op: opRules})
	})
	if err != nil {
		return fmt.Errorf("write rate-limit rules: %w", err)
	}
	return nil
}
