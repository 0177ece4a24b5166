package config

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
	"go.yaml.in/yaml/v3"
)

// daemons that read a key: p kf-producer, c schedule-consumer, d dlq-consumer.
const (
	rP = 1 << iota
	rC
	rD
	rAll = rP | rC | rD
)

// outOfRange is, for every key of the schema that has no range or enum
// tag, a value Validate must refuse by a rule of its code (not empty, a
// URL, a rule between keys), and the daemons that read it. A key whose
// every value is valid (a flag, a password) says why instead. A tagged key
// has no row: tagCases makes its case from the tag.
// TestEveryKeyRejectsOutOfRange fails when a key of the schema is in
// neither, so a new setting cannot be added without its bound.
var outOfRange = map[string]struct {
	bad     any
	readBy  int
	anyOK   string // why every value is valid
	wantKey string // the key the error names, when it is not the key itself
}{
	"ops.addr":                         {bad: " ", readBy: rAll},
	"ops.addrs":                        {bad: map[string]string{"kf-consumer": "127.0.0.1:1"}, readBy: rAll, wantKey: "ops.addrs.kf-consumer"},
	"ops.pprof":                        {anyOK: "a flag"},
	"redis.skip_eviction_policy_check": {anyOK: "a flag (checked against the server at start-up)"},

	"kafka.brokers":                    {bad: " ", readBy: rAll},
	"kafka.topics.main.name":           {bad: " ", readBy: rAll},
	"kafka.topics.main.retention_ms":   {bad: -5, readBy: rAll},
	"kafka.topics.dlq.name":            {bad: " ", readBy: rAll},
	"kafka.topics.dlq.retention_ms":    {bad: -5, readBy: rAll},
	"kafka.client_id":                  {bad: " ", readBy: rAll},
	"kafka.overrides":                  {bad: map[string]string{"acks": "1"}, readBy: rAll, wantKey: "kafka.overrides.acks"},
	"kafka.consumer.auto_offset_reset": {bad: "latest", readBy: rAll},
	"kafka.consumer.group_id":          {bad: " ", readBy: rAll},
	"kafka.consumer.max_poll_interval": {bad: "1s", readBy: rAll},

	"redis.addr": {bad: " ", readBy: rAll},

	"coord.enabled":        {anyOK: "a flag (the section is checked when it is on)"},
	"coord.endpoints":      {bad: []string{"ftp://x:1"}, readBy: rAll, wantKey: "coord.endpoints[0]"},
	"coord.namespace":      {bad: "kfpipe", readBy: rAll},
	"coord.username":       {bad: "ops", readBy: rAll}, // without a password
	"coord.password":       {bad: "secret", readBy: rAll, wantKey: "coord.username"},
	"coord.tls.cert_file":  {bad: "/nonexistent/cert.pem", readBy: rAll},
	"coord.tls.key_file":   {bad: "/nonexistent/key.pem", readBy: rAll},
	"coord.tls.ca_file":    {bad: "/nonexistent/ca.pem", readBy: rAll},
	"redis.key_prefix":     {bad: " ", readBy: rAll},
	"redis.master_name":    {bad: " ", readBy: rAll},
	"redis.cluster_addrs":  {bad: []string{"no-port"}, readBy: rAll, wantKey: "redis.cluster_addrs[0]"},
	"redis.password":       {anyOK: "any password (or none) is a valid password"},
	"redis.sentinel_addrs": {bad: []string{" "}, readBy: rAll, wantKey: "redis.sentinel_addrs[0]"},

	"callback.addr":             {bad: " ", readBy: rP},
	"callback.encoding_aes_key": {bad: "short", readBy: rP},
	"callback.path":             {bad: "no-slash", readBy: rP},
	"callback.token":            {bad: " ", readBy: rP},

	"wecom.base_url":        {bad: "ftp://x", readBy: rP | rC},
	"wecom.corp_id":         {bad: " ", readBy: rP},
	"wecom.open_kfids":      {bad: []string{" "}, readBy: rP, wantKey: "wecom.open_kfids[0]"},
	"wecom.deny_open_kfids": {bad: []string{" "}, readBy: rP, wantKey: "wecom.deny_open_kfids[0]"},
	"wecom.secret":          {bad: " ", readBy: rP},

	"idgen.epoch": {bad: "2999-01-01T00:00:00Z", readBy: rP},

	"dedup.store":         {bad: "claims", readBy: rC},
	"handler.http.secret": {anyOK: "any secret (or none: unsigned) is valid"},
	"handler.http.url":    {bad: "not a url", readBy: rC},

	"rate_limit.default_group":       {bad: "nosuch", readBy: rC | rD},
	"rate_limit.enabled":             {anyOK: "a flag"},
	"rate_limit.groups":              {bad: map[string]any{"": map[string]any{"window_seconds": 1, "max_messages": 1, "penalty_threshold": 1}}, readBy: rC | rD},
	"rate_limit.progressive.enabled": {anyOK: "a flag (its durations are checked when it is on)"},

	"dlq.emergency_file": {bad: " ", readBy: rC | rD},

	"admin.addr":             {bad: " ", readBy: rD},
	"admin.consumer_group":   {bad: " ", readBy: rD},
	"archive.dsn":            {bad: "mysql://127.0.0.1/x", readBy: rC | rD},
	"archive.group_id":       {bad: " ", readBy: rC | rD},
	"archive.outcomes_topic": {bad: " ", readBy: rC | rD},
	"admin.tokens":           {bad: []map[string]string{{"name": "x", "token": "short", "role": "viewer"}}, readBy: rD, wantKey: "admin.tokens[0].token"},

	"media.dir":           {bad: " ", readBy: rP | rC},
	"media.s3.endpoint":   {bad: "http://127.0.0.1:1", readBy: rP | rC},
	"media.s3.bucket":     {bad: "Bad_Bucket", readBy: rP | rC},
	"media.s3.region":     {anyOK: "any region name (S3-compatible servers use their own)"},
	"media.s3.access_key": {bad: "key-without-secret", readBy: rP | rC, wantKey: "media.s3.secret_key"},
	"media.s3.secret_key": {bad: "secret-without-key", readBy: rP | rC},
	"media.s3.prefix":     {bad: "/abs", readBy: rP | rC},
	"media.s3.tls":        {anyOK: "a flag"},
}

// keyCase is one refusal to check: a value of key that the loader of
// each daemon in readBy must refuse with an error containing want.
type keyCase struct {
	key    string // the key set (a data key below a map or list included)
	bad    any
	readBy int
	want   string
}

// tagCases walks the schema and makes, for every key with a range or enum
// tag, a value just past its bound (or outside its enum): the loader must
// refuse it with the key and the bound the tag states.
func tagCases(t *testing.T) (cases []keyCase, tagged map[string]bool) {
	tagged = map[string]bool{}
	var walk func(prefix string, typ reflect.Type, schemaKey string)
	walk = func(prefix string, typ reflect.Type, schemaKey string) {
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			key, squash, ok := schema.Key(f)
			if !ok {
				continue
			}
			if squash {
				walk(prefix, f.Type, schemaKey)
				continue
			}
			key = schema.Join(prefix, key)
			sk := schemaKey
			if sk == "" {
				sk = key
			}
			switch {
			case f.Type.Kind() == reflect.Struct:
				walk(key, f.Type, schemaKey)
				continue
			case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
				walk(key+".normal", f.Type.Elem(), key) // a shipped group: the others stay valid
				continue
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				walk(key+"[0]", f.Type.Elem(), key)
				continue
			}
			dataKey := key
			if f.Type.Kind() == reflect.Map {
				dataKey = key + ".rate_limited" // a dead-letter reason: every map here is by reason
			}
			readBy := readers(sk)
			// A map or list of sections is tagged below, in its
			// entries; its own rules (an entry's name, a token's
			// length) stay in outOfRange.
			direct := schemaKey == ""
			if e := schema.Enum(f); e != nil {
				tagged[sk] = direct
				cases = append(cases, keyCase{dataKey, "not-" + e[0], readBy, dataKey + " must be one of " + strings.Join(e, "|")})
			}
			r, ok, err := names.ParseRange(f)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if !ok {
				continue
			}
			tagged[sk] = direct
			bad, ok := pastBound(r)
			if !ok {
				t.Errorf("%s: range %s has no value outside it", key, r)
				continue
			}
			cases = append(cases, keyCase{dataKey, bad, readBy, dataKey + " must be " + r.String() + ", got "})
		}
	}
	walk("", reflect.TypeOf(union{}), "")
	return cases, tagged
}

// pastBound is a value just outside r, as YAML would spell it.
func pastBound(r schema.Range) (any, bool) {
	end, dir := r.Max, 1
	if !end.IsValid() {
		end, dir = r.Min, -1
	}
	if !end.IsValid() {
		return nil, false
	}
	open := r.MaxOpen
	if dir < 0 {
		open = r.MinOpen
	}
	switch {
	case end.Type() == reflect.TypeOf(time.Duration(0)):
		d := time.Duration(end.Int())
		if !open {
			d += time.Duration(dir)
		}
		return d.String(), true
	case end.CanInt():
		n := end.Int()
		if !open {
			n += int64(dir)
		}
		return n, true
	default:
		x := end.Float()
		if !open {
			x += float64(dir) * max(1, x/2)
		}
		return x, true
	}
}

// readers are the daemons whose configuration has key.
func readers(key string) int {
	by := 0
	for i, d := range daemonSchemas {
		if _, ok := valueAt(reflect.ValueOf(d.defaults(EnvTest)), key); ok {
			by |= 1 << i
		}
	}
	return by
}

// TestEveryKeyRejectsOutOfRange: for every key of the schema (every key a
// YAML file may set), a value out of range makes the loader of each daemon
// that reads it fail, naming that exact key (and, for a tagged key, the
// bound), before anything connects.
func TestEveryKeyRejectsOutOfRange(t *testing.T) {
	cases, tagged := tagCases(t)
	known, maps := map[string]bool{}, []string{}
	schemaKeys("", reflect.TypeOf(union{}), known, &maps)
	for _, m := range maps {
		known[m] = true
	}
	for k := range known {
		_, inTable := outOfRange[k]
		switch {
		case tagged[k] && inTable:
			t.Errorf("outOfRange has a row for %s, whose tags state its bound: delete the row", k)
		case !tagged[k] && !inTable:
			t.Errorf("key %s has neither a range or enum tag nor an out-of-range value in outOfRange: add its bound", k)
		}
	}
	for k, e := range outOfRange {
		if !known[k] {
			t.Errorf("outOfRange names %s, which the schema does not have", k)
		}
		if e.anyOK == "" {
			want := k
			if e.wantKey != "" {
				want = e.wantKey
			}
			cases = append(cases, keyCase{k, e.bad, e.readBy, want + " "})
		}
	}
	if len(cases) < 100 {
		t.Fatalf("only %d cases: the schema walk is broken", len(cases))
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].key < cases[j].key })
	base, err := os.ReadFile(repoConfig("test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	loaders := []struct {
		bit  int
		name string
		load func(string) error
	}{
		{rP, "kf-producer", func(p string) error { _, err := LoadProducer(p); return err }},
		{rC, "schedule-consumer", func(p string) error { _, err := LoadConsumer(p); return err }},
		{rD, "dlq-consumer", func(p string) error { _, err := LoadDLQConsumer(p); return err }},
	}
	checked := 0
	for _, c := range cases {
		k := c.key
		var doc map[string]any
		if err := yaml.Unmarshal(base, &doc); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(k, "media.s3.") { // checked with media.store: s3
			setKey(doc, "media.store", "s3")
			setKey(doc, "media.s3.endpoint", "127.0.0.1:18333")
			setKey(doc, "media.s3.bucket", "kfpipe-media")
		}
		if strings.HasPrefix(k, "archive.") && k != "archive.dsn" { // checked with the archive on
			setKey(doc, "archive.dsn", "postgres://127.0.0.1:15432/kfpipe")
		}
		if strings.HasPrefix(k, "admin.tokens[0].") {
			tok := map[string]any{"name": "x", "token": "0123456789abcdef", "role": "viewer"}
			tok[strings.TrimPrefix(k, "admin.tokens[0].")] = c.bad
			setKey(doc, "admin.tokens", []any{tok})
		} else {
			setKey(doc, k, c.bad)
		}
		if k == "redis.master_name" || k == "redis.sentinel_addrs" {
			setKey(doc, "redis.mode", "sentinel")
			if k == "redis.master_name" {
				setKey(doc, "redis.sentinel_addrs", []string{"127.0.0.1:26379"})
			}
		}
		if k == "redis.cluster_addrs" {
			setKey(doc, "redis.mode", "cluster")
		}
		if k == "handler.http.url" {
			setKey(doc, "handler.type", "http")
		}
		if strings.HasPrefix(k, "rate_limit.progressive.") {
			setKey(doc, "rate_limit.progressive.enabled", true)
		}
		if strings.HasPrefix(k, "coord.") {
			setKey(doc, "coord.enabled", true)
		}
		out, _ := yaml.Marshal(doc)
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, l := range loaders {
			if c.readBy&l.bit == 0 {
				continue
			}
			checked++
			err := l.load(path)
			if err == nil {
				t.Errorf("%s: %s: %v accepted", l.name, k, c.bad)
				continue
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %s: %v refused without %q: %v", l.name, k, c.bad, c.want, err)
			}
		}
	}
	n := 0
	for _, direct := range tagged {
		if direct {
			n++
		}
	}
	t.Logf("%d keys (%d tagged), %d cases, %d (key, daemon) refusals checked", len(known), n, len(cases), checked)
}

// setKey sets the dotted key in a decoded YAML document.
func setKey(doc map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := doc[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			doc[p] = next
		}
		doc = next
	}
	doc[parts[len(parts)-1]] = v
}
