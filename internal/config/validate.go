package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kfpipe/kfpipe/internal/config/schema"
	"github.com/kfpipe/kfpipe/internal/state"
)

// names are the values the tags name instead of spelling them: bounds and
// defaults another package owns (state's), or that code uses too.
var names = schema.Names{
	"DefaultSessionTimeout":        DefaultSessionTimeout,
	"DefaultStandbyAfterRedisLost": DefaultStandbyAfterRedisLost,
	"DefaultRecoveryTTL":           DefaultRecoveryTTL,
	"MinWindowSeconds":             MinWindowSeconds,
	"MaxWindowSeconds":             MaxWindowSeconds,
	"MaxBlockHours":                MaxBlockHours,
	"maxRateCount":                 maxRateCount,
	"MaxSequenceValue":             MaxSequenceValue,
}.With(state.Names)

// validator collects every rule violation so that one start attempt reports
// all bad keys at once, each message naming the key and what is allowed.
type validator struct {
	errs []error
}

func (v *validator) addf(key, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s %s", key, fmt.Sprintf(format, args...)))
}

// bounds checks every key of a daemon's configuration against its field's
// range and enum tags (package schema).
func (v *validator) bounds(cfg any) { v.boundsAt("", cfg) }

// boundsAt checks a section whose keys are under prefix.
func (v *validator) boundsAt(prefix string, section any) {
	v.addErr(names.Check(prefix, section))
}

// addErr adds the errors of a check that reports its own (a section's
// Validate), each error one entry.
func (v *validator) addErr(err error) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		v.errs = append(v.errs, j.Unwrap()...)
	} else if err != nil {
		v.errs = append(v.errs, err)
	}
}

func (v *validator) nonEmpty(key, got string) {
	if strings.TrimSpace(got) == "" {
		v.addf(key, "must not be empty")
	}
}

func (v *validator) err() error {
	return errors.Join(v.errs...)
}
