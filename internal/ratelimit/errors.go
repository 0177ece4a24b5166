package ratelimit

import (
	"errors"
	"fmt"
)

var (
	// ErrCircuitOpen is returned by Breakers.Allow while a user's breaker is
	// open, and in half-open once the trial messages are all admitted.
	ErrCircuitOpen = errors.New("ratelimit: circuit open")

	// ErrUnknownGroup is returned by Admin.SetGroup for a group that is not
	// in the current rules.
	ErrUnknownGroup = errors.New("ratelimit: unknown group")

	// ErrNotWhitelisted is returned by Admin.RemoveWhitelist for a user who
	// is not in the whitelist group.
	ErrNotWhitelisted = errors.New("ratelimit: user not whitelisted")

	// ErrInvalidRules is wrapped by New, NewAdmin and Admin.SetRules when a
	// rule set is unusable; the message names the key.
	ErrInvalidRules = errors.New("ratelimit: invalid rules")
)

// ErrRulesConflict is matched (errors.Is) by the *RulesConflictError that
// Admin.SetRulesIf returns when the rules changed since the version the
// caller read.
var ErrRulesConflict = errors.New("ratelimit: the rules changed since the version read")

// RulesConflictError is Admin.SetRulesIf's refusal: nothing was written.
type RulesConflictError struct {
	Expected int64
	// Current is the version of the rules now.
	Current int64
}

func (e *RulesConflictError) Error() string {
	return fmt.Sprintf("ratelimit: the rules are at version %d, not %d: read them again and re-apply the change", e.Current, e.Expected)
}

// Is makes errors.Is(err, ErrRulesConflict) true.
func (e *RulesConflictError) Is(target error) bool { return target == ErrRulesConflict }
