package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/coord"
)

// followEtcd starts the watch of the rules and group assignments in etcd
// (WithEtcdRules) and applies its first state before returning, so the
// limiter starts on the current rules. A change reaches every limiter as
// fast as etcd's watch delivers it; a watch that breaks resumes where it
// stopped, and one whose revision was compacted reloads everything (a
// resync), so no change is missed.
func (l *Limiter) followEtcd(ctx context.Context) error {
	wctx, stop := context.WithCancel(context.Background())
	ch, err := coord.WatchPrefix[json.RawMessage](wctx, l.o.etcd, etcdPrefix)
	if err != nil {
		stop()
		return fmt.Errorf("watch rate-limit rules in etcd: %w", err)
	}
	select {
	case ev, ok := <-ch:
		if !ok {
			stop()
			return fmt.Errorf("watch rate-limit rules in etcd: closed before its first state")
		}
		l.applyEtcd(ev)
	case <-ctx.Done():
		stop()
		return fmt.Errorf("watch rate-limit rules in etcd: %w", ctx.Err())
	}
	l.stopWatch = stop
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for ev := range ch {
			l.applyEtcd(ev)
		}
	}()
	return nil
}

// applyEtcd applies one watch event.
func (l *Limiter) applyEtcd(ev coord.Event[json.RawMessage]) {
	switch ev.Type {
	case coord.EventResync:
		var rules *json.RawMessage
		groups := map[string]string{}
		for _, e := range ev.Snapshot {
			if e.Key == etcdRulesKey {
				r := e.Value
				rules = &r
			} else if u, ok := userOfGroupKey(e.Key); ok {
				var g string
				if json.Unmarshal(e.Value, &g) == nil {
					groups[u] = g
				}
			}
		}
		l.installEtcdRules(rules)
		l.egMu.Lock()
		l.egroups = groups
		l.egMu.Unlock()
		// Every user takes its group from the new map on its next message.
		l.epoch.Add(1)
	case coord.EventPut, coord.EventDelete:
		if ev.Key == etcdRulesKey {
			var r *json.RawMessage
			if ev.Type == coord.EventPut {
				r = &ev.Value
			}
			l.installEtcdRules(r)
			return
		}
		user, ok := userOfGroupKey(ev.Key)
		if !ok {
			return
		}
		var g string
		if ev.Type == coord.EventPut {
			if err := json.Unmarshal(ev.Value, &g); err != nil {
				l.o.logger.Warn("ignore a group assignment in etcd that is not a JSON string", zap.String("key", ev.Key), zap.Error(err))
				return
			}
		}
		l.egMu.Lock()
		if g == "" {
			delete(l.egroups, user)
		} else {
			l.egroups[user] = g
		}
		l.egMu.Unlock()
		l.apply(event{Op: opGroup, User: user, Group: g})
	}
}

// installEtcdRules installs the rules override (nil: none, the configured
// rules); invalid rules are logged and the current ones kept.
func (l *Limiter) installEtcdRules(raw *json.RawMessage) {
	groups := l.cfg.Groups
	if raw != nil {
		var g map[string]groupJSON
		if err := json.Unmarshal(*raw, &g); err != nil {
			l.o.logger.Error("rate-limit rules in etcd are not valid JSON; keeping the current ones", zap.Error(err))
			return
		}
		groups = fromJSONGroups(g)
		if err := validateGroups(groups, l.cfg.DefaultGroup); err != nil {
			l.o.logger.Error("rate-limit rules in etcd refused; keeping the current ones", zap.Error(err))
			return
		}
	}
	l.rules.Store(compileRules(groups, l.cfg.DefaultGroup, l.rules.Load().gen+1, l.m))
	l.o.logger.Info("rate-limit rules installed from etcd", zap.Int("groups", len(groups)), zap.Bool("override", raw != nil))
}
