package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/prometheus/client_golang/prometheus"
)

// Group names.
const (
	// GroupWhitelist is never rate limited, whatever its rule says. An
	// explicit block (admin or earlier automatic one) still applies.
	GroupWhitelist = "whitelist"
)

// rule is one group's compiled rule.
type rule struct {
	name      string
	windowMs  int64
	max       int32
	threshold int32
	block     time.Duration // 0 = refusals never turn into a block
	whitelist bool

	// Resolved once per rule so the hot path does no label lookup.
	violations prometheus.Counter
	blocks     prometheus.Counter
}

// ruleSet is an immutable snapshot of the rules; a change swaps the whole
// set and bumps gen, and each user state re-resolves its rule lazily.
type ruleSet struct {
	gen    uint64
	def    *rule
	byName map[string]*rule
}

// lookup returns the rule of group, the default for "" or an unknown group
// (a group removed by a rules change falls back rather than failing).
func (rs *ruleSet) lookup(group string) *rule {
	if group != "" {
		if r, ok := rs.byName[group]; ok {
			return r
		}
	}
	return rs.def
}

func validateGroups(groups map[string]config.RateGroup, defaultGroup string) error {
	var errs []error
	if _, ok := groups[defaultGroup]; !ok {
		errs = append(errs, fmt.Errorf("rate_limit.default_group must name a group in rate_limit.groups, got %q", defaultGroup))
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		g, key := groups[n], "rate_limit.groups."+n
		if n == "" {
			errs = append(errs, errors.New("rate_limit.groups has a group with an empty name"))
		}
		if g.WindowSeconds < 0.001 || g.WindowSeconds > 86400*7 {
			errs = append(errs, fmt.Errorf("%s.window_seconds must be in [0.001, 604800], got %g", key, g.WindowSeconds))
		}
		if g.MaxMessages < 1 || g.MaxMessages > math.MaxInt32 {
			errs = append(errs, fmt.Errorf("%s.max_messages must be >= 1, got %d", key, g.MaxMessages))
		}
		if g.PenaltyThreshold < 1 || g.PenaltyThreshold > math.MaxInt32 {
			errs = append(errs, fmt.Errorf("%s.penalty_threshold must be >= 1, got %d", key, g.PenaltyThreshold))
		}
		if g.BlockHours < 0 || g.BlockHours > 24*365 {
			errs = append(errs, fmt.Errorf("%s.block_hours must be in [0, 8760], got %g", key, g.BlockHours))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidRules, errors.Join(errs...))
	}
	return nil
}

// compileRules builds a rule set; groups must have been validated.
func compileRules(groups map[string]config.RateGroup, defaultGroup string, gen uint64, m *limiterMetrics) *ruleSet {
	rs := &ruleSet{gen: gen, byName: make(map[string]*rule, len(groups))}
	for n, g := range groups {
		r := &rule{
			name:      n,
			windowMs:  int64(math.Round(g.WindowSeconds * 1000)),
			max:       int32(g.MaxMessages),
			threshold: int32(g.PenaltyThreshold),
			block:     time.Duration(g.BlockHours * float64(time.Hour)),
			whitelist: n == GroupWhitelist,
		}
		r.violations = m.violations.WithLabelValues(n)
		r.blocks = m.blocks.WithLabelValues(n)
		rs.byName[n] = r
	}
	rs.def = rs.byName[defaultGroup]
	return rs
}

// groupJSON is a rule as stored in rl:rules (the config key names).
type groupJSON struct {
	WindowSeconds    float64 `json:"window_seconds"`
	MaxMessages      int     `json:"max_messages"`
	PenaltyThreshold int     `json:"penalty_threshold"`
	BlockHours       float64 `json:"block_hours"`
}

func toJSONGroups(groups map[string]config.RateGroup) map[string]groupJSON {
	out := make(map[string]groupJSON, len(groups))
	for n, g := range groups {
		out[n] = groupJSON(g)
	}
	return out
}

func fromJSONGroups(groups map[string]groupJSON) map[string]config.RateGroup {
	out := make(map[string]config.RateGroup, len(groups))
	for n, g := range groups {
		out[n] = config.RateGroup(g)
	}
	return out
}
