package config

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// validator collects every rule violation so that one start attempt reports
// all bad keys at once, each message naming the key and what is allowed.
type validator struct {
	errs []error
}

func (v *validator) addf(key, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s %s", key, fmt.Sprintf(format, args...)))
}

func (v *validator) atLeast(key string, got, min int) {
	if got < min {
		v.addf(key, "must be >= %d, got %d", min, got)
	}
}

func (v *validator) between(key string, got, min, max int) {
	if got < min || got > max {
		v.addf(key, "must be in [%d, %d], got %d", min, max, got)
	}
}

func (v *validator) durationAtLeast(key string, got, min time.Duration) {
	if got < min {
		v.addf(key, "must be >= %s, got %s", min, got)
	}
}

func (v *validator) durationBetween(key string, got, min, max time.Duration) {
	if got < min || got > max {
		v.addf(key, "must be in [%s, %s], got %s", min, max, got)
	}
}

func (v *validator) nonEmpty(key, got string) {
	if strings.TrimSpace(got) == "" {
		v.addf(key, "must not be empty")
	}
}

func (v *validator) oneOf(key, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.addf(key, "must be one of %s, got %q", strings.Join(allowed, "|"), got)
}

func (v *validator) err() error {
	return errors.Join(v.errs...)
}
