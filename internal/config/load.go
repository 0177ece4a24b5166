//go:generate go run ./gen

// Package config loads each daemon's typed configuration with viper: a YAML
// file (from --config or KFPIPE_CONFIG), then KFPIPE_… environment
// overrides, then defaults for the chosen environment. Unknown keys in the
// file are errors, and Validate names every bad key with what is allowed.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// ReferencePath is where the generated reference of every key lives, from
// the module root.
const ReferencePath = "docs/config.md"

// EnvPrefix prefixes every environment override: kafka.brokers is
// KFPIPE_KAFKA_BROKERS.
const EnvPrefix = "KFPIPE"

// ErrNoConfigFile is returned when a path was given but cannot be read.
var ErrNoConfigFile = errors.New("config file not readable")

// validatable is what every daemon configuration implements.
type validatable interface{ Validate() error }

// LoadProducer loads and validates the kf-producer configuration.
func LoadProducer(path string) (*Producer, error) {
	c, err := load(path, defaultProducer)
	if err == nil {
		c.forDaemon("kf-producer")
	}
	return c, err
}

// LoadConsumer loads and validates the schedule-consumer configuration.
func LoadConsumer(path string) (*Consumer, error) {
	c, err := load(path, defaultConsumer)
	if err == nil {
		c.forDaemon("schedule-consumer")
		c.DLQ.EmergencyFile = c.DLQ.emergencyPath("schedule-consumer")
	}
	return c, err
}

// LoadDLQConsumer loads and validates the dlq-consumer configuration.
func LoadDLQConsumer(path string) (*DLQConsumer, error) {
	c, err := load(path, defaultDLQConsumer)
	if err == nil {
		c.forDaemon("dlq-consumer")
		c.DLQ.EmergencyFile = c.DLQ.emergencyPath("dlq-consumer")
	}
	return c, err
}

// Path returns the config file path: the flag value if set, else
// KFPIPE_CONFIG, else "" (defaults and environment only).
func Path(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	return os.Getenv(EnvPrefix + "_CONFIG")
}

func load[T any, PT interface {
	*T
	validatable
}](path string, defaults func(env string) T) (PT, error) {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoConfigFile, path, err)
		}
	}
	env := v.GetString("env")
	if env == "" {
		env = EnvDevelopment
	}
	switch env {
	case EnvDevelopment, EnvTest, EnvProduction:
	default:
		return nil, fmt.Errorf("env must be one of %s|%s|%s, got %q", EnvDevelopment, EnvTest, EnvProduction, env)
	}
	def := defaults(env)
	setDefaults(v, "", reflect.ValueOf(def))

	hooks := func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			adminTokensHook,
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
	}
	// One file serves all three daemons, so a key is unknown only if no
	// daemon knows it.
	if path != "" {
		if err := checkKnownKeys(path); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	out := new(T)
	if err := v.Unmarshal(out, hooks); err != nil {
		return nil, fmt.Errorf("config %s: %w", describe(path), err)
	}
	if err := PT(out).Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", describe(path), err)
	}
	return out, nil
}

// union has every section of every daemon; it exists to detect unknown keys.
type union struct {
	Common    `mapstructure:",squash"`
	Callback  Callback  `mapstructure:"callback"`
	WeCom     WeCom     `mapstructure:"wecom"`
	Sync      Sync      `mapstructure:"sync"`
	IDGen     IDGen     `mapstructure:"idgen"`
	Processor Processor `mapstructure:"processor"`
	Outage    Outage    `mapstructure:"outage"`
	Overload  Overload  `mapstructure:"overload"`
	Dedup     Dedup     `mapstructure:"dedup"`
	RateLimit RateLimit `mapstructure:"rate_limit"`
	Breaker   Breaker   `mapstructure:"breaker"`
	Handler   Handler   `mapstructure:"handler"`
	DLQ       DLQ       `mapstructure:"dlq"`
	Recovery  Recovery  `mapstructure:"recovery"`
	Admin     Admin     `mapstructure:"admin"`
	DLQIndex  DLQIndex  `mapstructure:"dlq_index"`
	Media     Media     `mapstructure:"media"`
	Archive   Archive   `mapstructure:"archive"`
}

func describe(path string) string {
	if path == "" {
		return "(defaults and environment)"
	}
	return path
}

// checkKnownKeys reads the file alone (no defaults, no environment) and
// reports every key that no daemon's configuration has, by full path. It
// walks the YAML itself because viper drops empty sections ("procesor: {}").
func checkKnownKeys(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	known, maps := map[string]bool{}, []string{}
	sections := map[string]bool{}
	schemaKeys("", reflect.TypeOf(union{}), known, &maps)
	for k := range known {
		for i := strings.IndexByte(k, '.'); i >= 0; i = nextDot(k, i) {
			sections[k[:i]] = true
		}
	}
	var unknown []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := strings.ToLower(k)
			if prefix != "" {
				key = prefix + "." + key
			}
			switch {
			case known[key] || underMap(key, maps):
			case sections[key]:
				if sub, ok := v.(map[string]any); ok {
					walk(key, sub)
				} else {
					unknown = append(unknown, key+" (a section, not a value)")
				}
			default:
				unknown = append(unknown, key)
			}
		}
	}
	walk("", doc)
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown key(s) %s (typo? see %s for the keys)", strings.Join(unknown, ", "), ReferencePath)
	}
	return nil
}

// KnownKey reports whether key ("kafka.consumer.session_timeout") is a key
// of some daemon's configuration, or a key under one of its maps
// ("recovery.max_retries.downstream_error"); a section ("kafka.consumer")
// counts too.
func KnownKey(key string) bool {
	known, maps := map[string]bool{}, []string{}
	schemaKeys("", reflect.TypeOf(union{}), known, &maps)
	if known[key] || underMap(key, maps) || slices.Contains(maps, key) {
		return true
	}
	for k := range known {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

func nextDot(s string, i int) int {
	j := strings.IndexByte(s[i+1:], '.')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// schemaKeys lists every leaf key of t; map-typed keys go to maps, since
// the keys below them are data (group names, reasons).
func schemaKeys(prefix string, t reflect.Type, known map[string]bool, maps *[]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("mapstructure")
		if tag == ",squash" {
			schemaKeys(prefix, f.Type, known, maps)
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		switch {
		case f.Type.Kind() == reflect.Struct:
			schemaKeys(key, f.Type, known, maps)
		case f.Type.Kind() == reflect.Map:
			*maps = append(*maps, key)
		default:
			known[key] = true
		}
	}
}

func underMap(key string, maps []string) bool {
	for _, m := range maps {
		if key == m || strings.HasPrefix(key, m+".") {
			return true
		}
	}
	return false
}

// setDefaults registers every leaf of the defaults struct with viper, so
// that environment overrides work for keys the file does not mention.
// Maps stay one default each: their keys are data (group names), not
// schema.
func setDefaults(v *viper.Viper, prefix string, rv reflect.Value) {
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		tag := f.Tag.Get("mapstructure")
		fv := rv.Field(i)
		if tag == ",squash" {
			setDefaults(v, prefix, fv)
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		switch f.Type.Kind() {
		case reflect.Struct:
			setDefaults(v, key, fv)
		case reflect.Map:
			// Per entry, so a file that changes one group keeps the others.
			if fv.Len() == 0 {
				v.SetDefault(key, fv.Interface())
			}
			iter := fv.MapRange()
			for iter.Next() {
				k := key + "." + iter.Key().String()
				if iter.Value().Kind() == reflect.Struct {
					setDefaults(v, k, iter.Value())
				} else {
					v.SetDefault(k, iter.Value().Interface())
				}
			}
		default:
			v.SetDefault(key, fv.Interface())
		}
	}
}

// adminTokensHook lets admin tokens come from one environment variable
// (a Kubernetes Secret or a systemd EnvironmentFile), never from a
// committed file: KFPIPE_ADMIN_TOKENS="name:role:token,name:role:token".
func adminTokensHook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to != reflect.TypeOf([]AdminToken{}) {
		return data, nil
	}
	var out []AdminToken
	for _, item := range strings.Split(data.(string), ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.SplitN(item, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("admin.tokens: %q must be name:role:token", redact(item))
		}
		out = append(out, AdminToken{Name: parts[0], Role: parts[1], Token: parts[2]})
	}
	return out, nil
}

// redact keeps an error message from echoing a secret.
func redact(s string) string {
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		return s[:i+1] + "…"
	}
	if len(s) > 4 {
		return s[:4] + "…"
	}
	return "…"
}

func itoa(i int) string { return strconv.Itoa(i) }
