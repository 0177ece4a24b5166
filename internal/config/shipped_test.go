package config

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestShippedConfigsSetOnlyWhatDiffers: config/*.yaml set only what differs
// from the defaults (docs/config.md lists those), so a default changed in
// the code is not silently overridden by a stale copy in a file. Each key
// the file sets is removed in turn: if every daemon then loads the same
// configuration, the key restated its default.
func TestShippedConfigsSetOnlyWhatDiffers(t *testing.T) {
	// Only the file speaks: no environment override of a key.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, EnvPrefix+"_") {
			t.Setenv(k, "") // viper ignores an empty variable
		}
	}
	for _, f := range []string{"development.yaml", "test.yaml", "production.yaml"} {
		t.Run(f, func(t *testing.T) {
			body, err := os.ReadFile(repoConfig(f))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(body), ReferencePath) {
				t.Errorf("%s: its header does not point at %s", f, ReferencePath)
			}
			if f == "production.yaml" { // its secrets come from the environment
				t.Setenv("KFPIPE_CALLBACK_TOKEN", "tok")
				t.Setenv("KFPIPE_CALLBACK_ENCODING_AES_KEY", strings.Repeat("a", 43))
				t.Setenv("KFPIPE_WECOM_CORP_ID", "corp")
				t.Setenv("KFPIPE_WECOM_SECRET", "secret")
			}
			var doc map[string]any
			if err := yaml.Unmarshal(body, &doc); err != nil {
				t.Fatal(err)
			}
			with := loadAll(t, repoConfig(f))
			for _, err := range with.errs {
				if err != nil {
					t.Fatalf("%s does not load: %v", f, err)
				}
			}
			keys := leafKeys("", doc)
			for _, key := range keys {
				if key == "env" {
					continue // picks the defaults it is compared with
				}
				without := deleteKey(doc, key)
				out, err := yaml.Marshal(without)
				if err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(t.TempDir(), f)
				if err := os.WriteFile(p, out, 0o600); err != nil {
					t.Fatal(err)
				}
				if got := loadAll(t, p); reflect.DeepEqual(got, with) {
					t.Errorf("%s sets %s to its default: delete the line (docs/config.md states the default)", f, key)
				}
			}
			t.Logf("%s: %d keys checked", f, len(keys))
		})
	}
}

type loaded struct {
	p    *Producer
	c    *Consumer
	d    *DLQConsumer
	errs [3]error
}

func loadAll(t *testing.T, path string) loaded {
	var l loaded
	l.p, l.errs[0] = LoadProducer(path)
	l.c, l.errs[1] = LoadConsumer(path)
	l.d, l.errs[2] = LoadDLQConsumer(path)
	for i, err := range l.errs {
		if err != nil { // compare whether it failed, not the temp path it names
			l.errs[i] = errFailed
		}
	}
	return l
}

var errFailed = os.ErrInvalid

// leafKeys lists the dotted keys of a YAML document's values: a list or
// a map under a map-typed key (ops.addrs, rate_limit.groups.vip) counts
// down to its scalars and lists.
func leafKeys(prefix string, m map[string]any) []string {
	var keys []string
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			keys = append(keys, leafKeys(key, sub)...)
			continue
		}
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

// deleteKey returns a copy of doc without key.
func deleteKey(doc map[string]any, key string) map[string]any {
	out := make(map[string]any, len(doc))
	first, rest, nested := strings.Cut(key, ".")
	for k, v := range doc {
		switch {
		case k != first:
			out[k] = v
		case nested:
			out[k] = deleteKey(v.(map[string]any), rest)
		}
	}
	return out
}
