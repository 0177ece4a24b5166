package kfpipe_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestREADMEHandler follows the README's "Write a handler in Go" alone: its
// Go snippet as main.go of a scratch module outside the repository, its
// "Test it" snippet as main_test.go, its require and replace lines
// (pointing at this checkout) in go.mod, go mod tidy (and tidy -diff clean
// there, at the root and in examples/), go vet, go test. The snippet is a
// Router with an image echo whose upload is kept with kfpipe.Memo; its
// test runs that echo twice and an injected 95018. Then the bot's own binary runs with
// --simulate, as "Chat with it" says, and its page is used in headless
// chromium: typed as the customer, "hello" gets the bot's answer; typed as
// a servicer, a message is handled and gets none.
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
	unitTest := fencedBlock(t, section, "```go main_test.go\n")
	if !strings.Contains(unitTest, "kfpipetest.") {
		t.Fatalf("the README's test does not use kfpipetest:\n%s", unitTest)
	}
	for _, want := range []string{"kfpipe.NewRouter()", "kfpipe.Memo(", "UploadMedia("} {
		if !strings.Contains(code, want) {
			t.Fatalf("the README's handler does not use %s (a router; an image echo with a memo):\n%s", want, code)
		}
	}
	for _, want := range []string{"RunTwice(h.ImageWith(", "ErrcodeServicerSession", "ExpectNoReplies()"} {
		if !strings.Contains(unitTest, want) {
			t.Fatalf("the README's test does not use %s (RunTwice of the image echo; an injected 95018; no reply at all):\n%s", want, unitTest)
		}
	}
	if !strings.Contains(modLines, "=> ../kfpipe") {
		t.Fatalf("the README's go.mod lines do not replace kfpipe with ../kfpipe:\n%s", modLines)
	}
	if !strings.Contains(section, "go run . --simulate") {
		t.Fatalf("the README does not say how to chat with the bot (go run . --simulate):\n%s", section)
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// The repository's own modules are tidy too: what the README's reader
	// builds against and the examples beside it.
	for _, mod := range []string{root, filepath.Join(root, "examples")} {
		cmd := exec.Command("go", "mod", "tidy", "-diff")
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go mod tidy -diff in %s: %v\n%s", mod, err, out)
		}
	}
	dir := t.TempDir()
	gomod := "module example.com/bot\n\ngo 1.26\n\n" + strings.ReplaceAll(modLines, "../kfpipe", root)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"main.go": code, "main_test.go": unitTest} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "bot")
	for _, args := range [][]string{{"mod", "tidy"}, {"mod", "tidy", "-diff"}, {"vet", "."}, {"test", "-count=1", "."}, {"build", "-o", bin, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module made from the README: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), err, out, gomod)
		}
	}

	// "Chat with it": the same binary, --simulate, in a browser.
	bctx := testenv.Browser(t, 2*time.Minute)
	url := startSimulator(t, bin, "--simulate=127.0.0.1:0")
	openSimulator(t, bctx, url, "readme-user")
	sendInSimulator(t, bctx, false, "hello")
	testenv.PollJS(t, bctx, "the bot's answer to the customer", botMsgs+`.length === 1 && `+botMsgs+`[0].innerText.includes("You said: hello")`, 60*time.Second)
	sendInSimulator(t, bctx, true, "Hi, I am Alice")
	expectServicerHandledUnanswered(t, bctx, 1)
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
