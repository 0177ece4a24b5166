package ratelimit

import (
	"fmt"
	"math"
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

// validateGroups checks rules with the configuration's own check (one
// bound per setting: config.ValidateRateGroups).
func validateGroups(groups map[string]config.RateGroup, defaultGroup string) error {
	if err := config.ValidateRateGroups(groups, defaultGroup); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRules, err)
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
