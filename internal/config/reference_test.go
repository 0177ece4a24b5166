package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// update makes TestReferenceUpToDate write docs/config.md (make
// config-docs) instead of comparing it.
var update = flag.Bool("update", false, "rewrite docs/config.md from the schema")

// TestReferenceUpToDate: docs/config.md is what the generator makes of the
// schema now, so a key added, renamed, re-defaulted or re-bounded without
// regenerating it fails here; and every key has a meaning (the generator
// refuses a field without a doc comment).
func TestReferenceUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := Reference(root)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(filepath.Join(root, ReferencePath), want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(filepath.Join(root, ReferencePath))
	if err != nil {
		t.Fatalf("%v (run make config-docs)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s is not what the schema generates (first difference at line %d); run make config-docs\n have: %s\n want: %s",
					ReferencePath, i+1, g, w)
			}
		}
	}
}

// TestReferenceListsEveryKey: each key of the schema (every key a file may
// set) has its row, with the daemons that read it.
func TestReferenceListsEveryKey(t *testing.T) {
	out, err := Reference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	known, maps := map[string]bool{}, []string{}
	schemaKeys("", reflect.TypeOf(union{}), known, &maps)
	for _, m := range maps {
		known[m] = true
	}
	for k := range known {
		if !bytes.Contains(out, []byte("| `"+k+"` |")) {
			t.Errorf("key %s has no row in the reference", k)
		}
	}
	for _, row := range []string{
		"| `callback.token` | string | empty | — | kf-producer |",
		"| `dedup.lease` | duration | `10s` | [1s, 24h] | schedule-consumer |",
		"| `kafka.topics.main.partitions` | int | `4` (production: `12`) | [1, 10000] | all |",
		"| `processor.standby_after_redis_lost` | duration | `30s` | 0 (never leaves) or [1s, 1h] |",
		"| `recovery.default_ttl` | duration | `168h` | >= 1m | schedule-consumer, dlq-consumer |",
	} {
		if !bytes.Contains(out, []byte(row)) {
			t.Errorf("reference lacks the row %q", row)
		}
	}
}
