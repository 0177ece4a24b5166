package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocumentedKeysExist: every configuration key the documentation names
// (in backticks: `kafka.consumer.session_timeout`) is a key some daemon
// reads. A renamed or misspelt key in the docs (`sync.open_kfids` for
// `wecom.open_kfids`) sends an operator to set something nothing reads.
func TestDocumentedKeysExist(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md", "../../deploy/systemd/README.md")
	sections := map[string]bool{}
	for _, s := range []string{"env", "log", "ops", "kafka", "redis", "callback", "wecom", "sync", "idgen", "processor", "outage", "overload",
		"dedup", "rate_limit", "breaker", "handler", "dlq", "recovery", "admin", "dlq_index", "coord", "media"} {
		if !KnownKey(s) {
			t.Fatalf("section %s unknown to the schema", s)
		}
		sections[s] = true
	}
	key := regexp.MustCompile("`([a-z_]+(?:\\.[a-z0-9_<>{}-]+)+)`")
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range key.FindAllStringSubmatch(string(b), -1) {
			k := m[1]
			if !sections[strings.SplitN(k, ".", 2)[0]] {
				continue // not a config key (a package, a file, a metric)
			}
			if i := strings.IndexAny(k, "<{"); i >= 0 {
				k = strings.TrimSuffix(k[:i], ".") // a placeholder: the map above it
			}
			checked++
			if !KnownKey(k) {
				t.Errorf("%s names config key %q, which no daemon reads", filepath.Base(f), m[1])
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d documented keys found; the pattern is broken", checked)
	}
	t.Logf("%d documented keys checked", checked)
}
