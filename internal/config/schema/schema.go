// Package schema reads a setting's default and bounds from its struct
// field, so each is stated once, beside the field and its doc comment, and
// the defaults, the bounds check and the generated reference
// (docs/config.md) all read the same tags:
//
//	Timeout time.Duration `mapstructure:"timeout" default:"5s" range:"[1ms, 5m]"`
//
// Tags:
//   - mapstructure: the key, as the loader (viper) reads it; ",squash"
//     puts the embedded struct's keys at this level.
//   - default: the value a zero field takes (a duration, a number, a bool,
//     a string, or a comma list for []string), or the name of a value in
//     Names ("state.DefaultLease").
//   - range: the allowed interval in math notation, "[1s, 5m]", "(0, 1]",
//     "[1024,)" (no upper bound); an end may name a value in Names
//     ("[1s, state.MaxLease]"). On a map, every value of the map.
//   - zero: 0 is allowed besides the range, and means what the tag says
//     ("never").
//   - enum: the allowed strings, "debug|info|warn|error".
//
// A section (a struct field) whose type has its own Validate method is
// left to it; one with a BoundsApply method that returns false is skipped
// (its keys are checked only when the section is on). Rules between keys
// stay code in the daemon configuration's Validate.
//
// It imports nothing of kfpipe, so any package's Config can use it.
package schema

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Names are values a default or range tag may name instead of spelling
// them, so a bound owned by another package ("state.MaxLease") is stated
// there only.
type Names map[string]any

// With returns n and others in one registry (a configuration that
// composes sections of other packages names their values too).
func (n Names) With(others ...Names) Names {
	out := Names{}
	for _, m := range append([]Names{n}, others...) {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

var durationType = reflect.TypeOf(time.Duration(0))

// Key returns the field's key (its mapstructure tag), "" for a squashed
// field, and whether the field is a key at all.
func Key(f reflect.StructField) (key string, squash, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	tag := f.Tag.Get("mapstructure")
	if tag == ",squash" {
		return "", true, true
	}
	if tag == "" || tag == "-" {
		return "", false, false
	}
	return strings.Split(tag, ",")[0], false, true
}

// Join joins a prefix and a key with a dot.
func Join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// SetDefaults sets every zero field of the struct ptr points to (and of
// its nested sections) that has a default tag to that default. A tag that
// does not parse is a programming error: it panics, naming the field.
func (n Names) SetDefaults(ptr any) {
	rv := reflect.ValueOf(ptr)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("schema: SetDefaults needs a pointer to a struct, got %T", ptr))
	}
	n.setDefaults(rv.Elem())
}

func (n Names) setDefaults(rv reflect.Value) {
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		if _, _, ok := Key(f); !ok {
			continue
		}
		fv := rv.Field(i)
		if f.Type.Kind() == reflect.Struct {
			n.setDefaults(fv)
			continue
		}
		def, has := f.Tag.Lookup("default")
		if !has || !fv.IsZero() {
			continue
		}
		val, err := n.Parse(def, f.Type)
		if err != nil {
			panic(fmt.Sprintf("schema: %s.%s: default tag: %v", rt.Name(), f.Name, err))
		}
		fv.Set(val)
	}
}

// Parse reads a tag's value as a value of type t, or looks it up in n.
func (n Names) Parse(s string, t reflect.Type) (reflect.Value, error) {
	s = strings.TrimSpace(s)
	if v, ok := n[s]; ok {
		rv := reflect.ValueOf(v)
		if !rv.CanConvert(t) {
			return reflect.Value{}, fmt.Errorf("%s is a %T, not a %s", s, v, t)
		}
		return rv.Convert(t), nil
	}
	out := reflect.New(t).Elem()
	switch {
	case t == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return out, err
		}
		out.SetInt(int64(d))
	case t.Kind() == reflect.String:
		out.SetString(s)
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return out, err
		}
		out.SetBool(b)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		i, err := strconv.ParseInt(s, 0, 64)
		if err != nil {
			return out, err
		}
		out.SetInt(i)
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return out, err
		}
		out.SetFloat(f)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		var items []string
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		out.Set(reflect.ValueOf(items).Convert(t))
	default:
		return out, fmt.Errorf("no tag values of type %s", t)
	}
	return out, nil
}

// Range is a parsed range tag: an interval whose ends are inclusive or
// not, either of which may be open (no bound).
type Range struct {
	Min, Max         reflect.Value // invalid: no bound
	MinOpen, MaxOpen bool          // exclusive ends: "(" and ")"
	// Zero, when set, allows 0 besides the interval, meaning Zero.
	Zero string
}

// ParseRange parses f's range and zero tags; ok is false when f has no
// range tag.
func (n Names) ParseRange(f reflect.StructField) (r Range, ok bool, err error) {
	tag, has := f.Tag.Lookup("range")
	if !has {
		return r, false, nil
	}
	t := f.Type
	if t.Kind() == reflect.Map {
		t = t.Elem()
	}
	tag = strings.TrimSpace(tag)
	if len(tag) < 3 || !strings.Contains("[(", tag[:1]) || !strings.Contains("])", tag[len(tag)-1:]) {
		return r, true, fmt.Errorf("range %q: want [min, max], (min, max), or an end left empty", tag)
	}
	ends := strings.Split(tag[1:len(tag)-1], ",")
	if len(ends) != 2 {
		return r, true, fmt.Errorf("range %q: want two ends", tag)
	}
	r.MinOpen, r.MaxOpen = tag[0] == '(', tag[len(tag)-1] == ')'
	if s := strings.TrimSpace(ends[0]); s != "" {
		if r.Min, err = n.Parse(s, t); err != nil {
			return r, true, fmt.Errorf("range %q: %v", tag, err)
		}
	}
	if s := strings.TrimSpace(ends[1]); s != "" {
		if r.Max, err = n.Parse(s, t); err != nil {
			return r, true, fmt.Errorf("range %q: %v", tag, err)
		}
	}
	r.Zero = f.Tag.Get("zero")
	return r, true, nil
}

// Enum returns f's allowed values (its enum tag), nil when it has none.
func Enum(f reflect.StructField) []string {
	tag, ok := f.Tag.Lookup("enum")
	if !ok {
		return nil
	}
	return strings.Split(tag, "|")
}

// less compares two values of one numeric kind.
func less(a, b reflect.Value) bool {
	switch {
	case a.CanInt():
		return a.Int() < b.Int()
	case a.CanUint():
		return a.Uint() < b.Uint()
	default:
		return a.Float() < b.Float()
	}
}

// Format prints a value as errors and the reference show it: durations
// as Go prints them, floats in %g.
func Format(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.Float32 || v.Kind() == reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	default:
		return fmt.Sprint(v.Interface())
	}
}

// Contains reports whether v is allowed.
func (r Range) Contains(v reflect.Value) bool {
	if r.Zero != "" && v.IsZero() {
		return true
	}
	if r.Min.IsValid() && (less(v, r.Min) || r.MinOpen && !less(r.Min, v)) {
		return false
	}
	if r.Max.IsValid() && (less(r.Max, v) || r.MaxOpen && !less(v, r.Max)) {
		return false
	}
	return true
}

// String prints the range as an error states it: "in [1s, 5m0s]",
// ">= 1", "in (0, 1]", with "0 (never) or " before it when zero is
// allowed.
func (r Range) String() string {
	var s string
	switch {
	case r.Min.IsValid() && r.Max.IsValid():
		open, closing := "[", "]"
		if r.MinOpen {
			open = "("
		}
		if r.MaxOpen {
			closing = ")"
		}
		s = "in " + open + Format(r.Min) + ", " + Format(r.Max) + closing
	case r.Min.IsValid() && r.MinOpen:
		s = "> " + Format(r.Min)
	case r.Min.IsValid():
		s = ">= " + Format(r.Min)
	case r.Max.IsValid() && r.MaxOpen:
		s = "< " + Format(r.Max)
	case r.Max.IsValid():
		s = "<= " + Format(r.Max)
	default:
		s = "any value"
	}
	if r.Zero != "" {
		s = "0 (" + r.Zero + ") or " + s
	}
	return s
}

// Check reports every key of the struct v (a struct or a pointer to one)
// whose value is outside its range or enum, each error naming the key
// (under prefix) and what is allowed: "ops.ready_timeout must be in
// [100ms, 1m0s], got 1ms".
func (n Names) Check(prefix string, v any) error {
	rv := reflect.Indirect(reflect.ValueOf(v))
	var errs []error
	n.check(prefix, rv, &errs)
	return errors.Join(errs...)
}

// BoundsApplier is a section whose keys' bounds apply only in some states
// (a section that is off): Check skips it when BoundsApply returns false.
type BoundsApplier interface{ BoundsApply() bool }

type selfValidating interface{ Validate() error }

func (n Names) check(prefix string, rv reflect.Value, errs *[]error) {
	if a, ok := rv.Interface().(BoundsApplier); ok && !a.BoundsApply() {
		return
	}
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		key, squash, ok := Key(f)
		if !ok {
			continue
		}
		fv := rv.Field(i)
		if squash {
			n.check(prefix, fv, errs)
			continue
		}
		key = Join(prefix, key)
		switch f.Type.Kind() {
		case reflect.Struct:
			if _, ok := fv.Interface().(selfValidating); ok {
				continue // its own Validate checks it
			}
			n.check(key, fv, errs)
			continue
		case reflect.Map:
			iter := fv.MapRange()
			for iter.Next() {
				k := key + "." + fmt.Sprint(iter.Key().Interface())
				if iter.Value().Kind() == reflect.Struct {
					n.check(k, iter.Value(), errs)
				} else {
					n.checkValue(k, f, iter.Value(), errs)
				}
			}
			continue
		case reflect.Slice:
			if f.Type.Elem().Kind() == reflect.Struct {
				for j := 0; j < fv.Len(); j++ {
					n.check(key+"["+strconv.Itoa(j)+"]", fv.Index(j), errs)
				}
				continue
			}
		}
		n.checkValue(key, f, fv, errs)
	}
}

func (n Names) checkValue(key string, f reflect.StructField, v reflect.Value, errs *[]error) {
	if allowed := Enum(f); allowed != nil {
		if s := v.String(); !contains(allowed, s) {
			*errs = append(*errs, fmt.Errorf("%s must be one of %s, got %q", key, strings.Join(allowed, "|"), s))
		}
	}
	r, ok, err := n.ParseRange(f)
	if err != nil {
		panic(fmt.Sprintf("schema: %s: %v", key, err))
	}
	if ok && !r.Contains(v) {
		*errs = append(*errs, fmt.Errorf("%s must be %s, got %s", key, r, Format(v)))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// IsHTTPURL reports whether s is an absolute http or https URL with a
// host: the rule of wecom.base_url and handler.http.url, which the WeChat
// client applies to a base URL given in code too (package kf). It lives
// in this leaf so that the client need not import the configuration.
func IsHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
