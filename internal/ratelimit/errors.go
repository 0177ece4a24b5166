package ratelimit

import "errors"

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
