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
// "Test it" snippet as main_test.go, its require and replace lines
// (pointing at this checkout) in go.mod, go mod tidy, go vet, go test.
// The snippet must answer customers only. One more test file, the test's
// own, runs the bot in the chat simulator (kfpipesim, as --simulate does)
// and sends it one message through the page's API: the reply must come.
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
	for name, src := range map[string]string{"main.go": code, "main_test.go": unitTest, "sim_test.go": simSmokeTest} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "."}, {"test", "-count=1", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module made from the README: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), err, out, gomod)
		}
	}
}

// simSmokeTest is the scratch module's own test of the README's bot in
// the chat simulator: "hello" as the customer, the reply within a minute.
const simSmokeTest = `package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/kfpipesim"
)

func TestInSimulator(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- kfpipesim.Run(ctx, bot, kfpipesim.WithAddr("127.0.0.1:0"), kfpipesim.WithOutput(pw)); pw.Close() }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kfpipesim.Run: %v", err)
		}
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatal("the simulator printed nothing")
	}
	go io.Copy(io.Discard, pr)
	url := regexp.MustCompile("http://\\S+/").FindString(sc.Text())
	if url == "" {
		t.Fatalf("no URL in %q", sc.Text())
	}
	resp, err := http.Post(url+"api/send", "application/json", strings.NewReader(` + "`" + `{"user":"u1","as":"customer","text":"hello"}` + "`" + `))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("send: %s", resp.Status)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(url + "api/state?user=u1")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Messages []struct {
				From, Text string
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Messages {
			if m.From == "bot" {
				if m.Text != "You said: hello" {
					t.Fatalf("the bot answered %q", m.Text)
				}
				return
			}
		}
	}
	t.Fatal("no reply within a minute")
}
`

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
