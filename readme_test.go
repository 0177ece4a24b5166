package kfpipe_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEHandler follows the README's "Write a handler in Go" alone: its
// Go snippet as main.go of a scratch module outside the repository, its
// require and replace lines (pointing at this checkout) in go.mod, go mod
// tidy, go vet. The snippet must answer customers only.
func TestREADMEHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with cgo")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := sectionOf(t, string(readme), "## Write a handler in Go")
	code := fencedBlock(t, section, "```go\n")
	modLines := fencedBlock(t, section, "```go.mod\n")
	if !strings.Contains(code, "m.FromCustomer()") {
		t.Fatalf("the README's handler does not filter the message's origin:\n%s", code)
	}
	if !strings.Contains(modLines, "=> ../kfpipe") {
		t.Fatalf("the README's go.mod lines do not replace kfpipe with ../kfpipe:\n%s", modLines)
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/bot\n\ngo 1.26\n\n" + strings.ReplaceAll(modLines, "../kfpipe", root)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	// vet compiles and type-checks main.go; linking the binary (librdkafka)
	// would add most of a minute and check nothing more.
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module made from the README: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), err, out, gomod)
		}
	}
}

// sectionOf returns the README's text from heading to the next "## ".
func sectionOf(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q section", heading)
	}
	s := doc[i+1+len(heading):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// fencedBlock returns the body of the first fenced block that opens with
// fence ("```go\n", "```go.mod\n").
func fencedBlock(t *testing.T, s, fence string) string {
	t.Helper()
	i := strings.Index(s, fence)
	if i < 0 {
		t.Fatalf("no %q block in:\n%s", fence, s)
	}
	body := s[i+len(fence):]
	j := strings.Index(body, "```")
	if j < 0 {
		t.Fatalf("unterminated %q block", fence)
	}
	return body[:j]
}
