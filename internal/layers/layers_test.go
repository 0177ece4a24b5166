// Package layers holds the test that keeps docs/architecture.md's layer
// drawing true: it reads the module's imports with go list and fails on
// an import the drawing forbids.
package layers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/kfpipe/kfpipe"

// drawing is docs/architecture.md's "Dependencies point inward" line,
// outermost first: a package may import one of its own layer or of a layer
// after it, never one before it. Packages the drawing does not name are
// not checked.
var drawing = [][]string{
	{""}, // the public package, kfpipe (the module root)
	{"internal/daemon", "internal/producer", "internal/consumer", "internal/dlq", "internal/console", "internal/console/sources"},
	{"internal/ratelimit", "internal/idgen", "internal/lock", "internal/wecom"},
	{"internal/chatmsg", "internal/handler", "internal/offsets", "internal/kafkaclient", "internal/redisconn"},
	{"internal/config", "internal/obs"},
	{"internal/config/schema", "internal/deadletter", "internal/coord/coordconfig", "internal/state", "internal/kafkaclient/keyhash"},
}

// contract are the packages that run a handler's effects (the exactly-once
// replies, the media copies, History) and the public package: they build
// on the handler contract (internal/handler), never on the engine.
var contract = []string{"", "internal/reply", "internal/media", "internal/history"}

type pkg struct {
	ImportPath string
	Imports    []string
}

var listed struct {
	once sync.Once
	pkgs map[string][]string
	err  error
}

// modulePackages returns the module's packages (by path relative to the
// module) with their imports; tests' imports are left out: a test may
// reach further than its package.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	listed.once.Do(func() { listed.pkgs, listed.err = list() })
	if listed.err != nil {
		t.Fatal(listed.err)
	}
	return listed.pkgs
}

func list() (map[string][]string, error) {
	cmd := exec.Command("go", "list", "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v: %s", err, stderr.String())
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %v", err)
		}
		pkgs[rel(p.ImportPath)] = p.Imports
	}
	return pkgs, nil
}

// rel is path relative to the module ("" for the module root).
func rel(path string) string {
	if path == module {
		return ""
	}
	return strings.TrimPrefix(path, module+"/")
}

func inModule(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

func name(p string) string {
	if p == "" {
		return "kfpipe"
	}
	return p
}

func TestImportsFollowTheDrawing(t *testing.T) {
	pkgs := modulePackages(t)
	layer := map[string]int{}
	for i, l := range drawing {
		for _, p := range l {
			if _, ok := pkgs[p]; !ok {
				t.Errorf("the drawing names %s, which the module does not have: update the drawing", name(p))
			}
			layer[p] = i
		}
	}
	var bad []string
	for p, imports := range pkgs {
		from, ok := layer[p]
		if !ok {
			continue
		}
		for _, imp := range imports {
			if !inModule(imp) {
				continue
			}
			if to, ok := layer[rel(imp)]; ok && to < from {
				bad = append(bad, name(p)+" imports "+name(rel(imp))+", which the drawing puts above it")
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// TestConfigImportsOnlyLeaves: internal/config composes the sections and
// tables of the packages in the drawing's last layer, and nothing else of
// the module, also indirectly.
func TestConfigImportsOnlyLeaves(t *testing.T) {
	pkgs := modulePackages(t)
	allowed := map[string]bool{"internal/config": true}
	for _, p := range drawing[len(drawing)-1] {
		allowed[p] = true
	}
	seen := map[string]bool{}
	var walk func(p, via string)
	walk = func(p, via string) {
		if seen[p] {
			return
		}
		seen[p] = true
		if !allowed[p] {
			t.Errorf("internal/config depends on %s (through %s), which the drawing puts above it", name(p), via)
		}
		for _, imp := range pkgs[p] {
			if inModule(imp) {
				walk(rel(imp), p)
			}
		}
	}
	walk("internal/config", "")
}

func TestContractNotEngine(t *testing.T) {
	pkgs := modulePackages(t)
	for _, p := range contract {
		for _, imp := range pkgs[p] {
			if imp == module+"/internal/consumer" {
				t.Errorf("%s imports internal/consumer: it builds on the handler contract, internal/handler", name(p))
			}
		}
	}
}

// TestClientWithoutConfiguration: the public WeChat client (package kf) is
// imported by bots that have no daemon configuration; it must not pull in
// internal/config (and with it the configuration loader) through any of
// its imports. A rule both need lives in a leaf (config/schema).
func TestClientWithoutConfiguration(t *testing.T) {
	pkgs := modulePackages(t)
	seen := map[string]bool{}
	var walk func(p, via string)
	walk = func(p, via string) {
		if seen[p] {
			return
		}
		seen[p] = true
		path := name(p)
		if via != "" {
			path = via + " → " + path
		}
		for _, imp := range pkgs[p] {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if r := rel(imp); r == "internal/config" {
				t.Errorf("kf reaches internal/config through %s", path)
			} else {
				walk(r, path)
			}
		}
	}
	walk("kf", "")
}
