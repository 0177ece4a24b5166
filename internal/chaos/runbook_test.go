package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestRunbookDLQGrowing executes docs/operations.md's runbook "The DLQ is
// growing: what do I do" as written, on a running pipeline whose
// downstream fails for a few users: once with kfpipectl — every kfpipectl
// command of the runbook's downstream path, read from the document, with
// its placeholders filled — and once with the console in headless
// chromium (filter by reason, "Retry all matching…", the dry run, the
// reason, the Batches card). Each time, after the fix and the retry, every
// message of the failing users has its effect once and in order, the
// counts the runbook promises are printed, and the audit log has the
// operator's action with the reason. The limiter rules and DLQ timings
// are the shipped ones, so the scheduler's own backoff (1 min) does not
// bring the letters back before the operator acts.
func TestRunbookDLQGrowing(t *testing.T) {
	svc := NeedServices(t)
	steps := runbookCommands(t)
	ctl := buildCtl(t)
	bctx := testenv.Browser(t, 6*time.Minute)
	env := map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": shippedDefaultGroup(t)}
	dlqEnv := map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": shippedDefaultGroup(t),
		"KFPIPE_RECOVERY_BASE_DELAY": shippedRecovery(t).BaseDelay.String(),
		"KFPIPE_RECOVERY_MAX_DELAY":  shippedRecovery(t).MaxDelay.String()}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1,
		SinkSleep: time.Millisecond, ConsumerEnv: env, DLQEnv: dlqEnv})
	var mu sync.Mutex
	Run(t, "runbook-dlq-growing", p, Load{Total: 600, Users: 100, Rate: 10, MaxPerUser: 10}, 3*time.Minute,
		func(ctx context.Context, p *Pipeline, rec *Report) error {
			run := func(args ...string) (string, int) {
				cmd := exec.CommandContext(ctx, ctl, args...)
				cmd.Env = append(os.Environ(), "KFPIPE_ADMIN_URL="+p.AdminURL, "KFPIPE_TOKEN="+OperatorToken)
				out, err := cmd.CombinedOutput()
				code := 0
				if err != nil {
					code = -1
					if ee, ok := err.(*exec.ExitError); ok {
						code = ee.ExitCode()
					}
				}
				mu.Lock()
				t.Logf("$ kfpipectl %s (exit %d)\n%s", strings.Join(args, " "), code, out)
				mu.Unlock()
				return string(out), code
			}
			users := func(prefix string, n int) []string {
				out := make([]string, n)
				for i := range out {
					out[i] = fmt.Sprintf("%s%02d-%s", prefix, i, p.Prefix[len("chaos-"):len(p.Prefix)-1])
				}
				return out
			}
			// breakFor makes the downstream fail for users, who then write
			// perUser messages each, and waits until they are letters.
			const perUser = 5
			breakFor := func(us []string) error {
				for _, u := range us {
					p.Sink.FailUser(u)
				}
				for range perUser {
					p.feeder.appendUsers(ctx, us, func(int, string) string { return p.OpenKfIDs[0] })
					if !Pause(ctx, time.Second, time.Second) {
						return ctx.Err()
					}
				}
				return waitLetters(ctx, p, us, perUser, 2*time.Minute)
			}
			fix := func(us []string) {
				for _, u := range us {
					p.Sink.UnfailUser(u)
				}
			}

			// With kfpipectl.
			cli := users("rbk", 3)
			if err := breakFor(cli); err != nil {
				return err
			}
			for _, s := range steps {
				args := s.fill(map[string]string{"R": "downstream_error", "U": cli[0]})
				// Step 3 of the downstream path is the retry by reason.
				step3 := s.is("dlq", "retry") && s.has("--failure-reason", "downstream_error")
				switch {
				case !s.is("health") && !s.is("dlq", "ls") && !step3:
					// Off the downstream path (a bot, junk, a cancel): the
					// command must at least be one kfpipectl knows, flags
					// and all.
					if out, code := run(append(args, "--help")...); code != 0 {
						rec.Problem("runbook command %q is not a valid kfpipectl command: %q", s.text, out)
					}
				case s.is("health"):
					// Step 1: healthy, no stale consumer.
					out, code := run(args...)
					if code != 0 || strings.Contains(out, "stale") {
						rec.Problem("runbook step 1 %q: exit %d, stale consumer in %q", s.text, code, out)
					}
				case s.is("dlq", "ls"):
					// Step 2: the failing users' letters listed.
					out, code := run(args...)
					for _, u := range cli {
						if code != 0 || !strings.Contains(out, u) {
							rec.Problem("runbook step 2 %q: exit %d, user %s not listed", s.text, code, u)
						}
					}
				case step3:
					// Step 3, after the fix: retried N … skipped M already done.
					fix(cli)
					out, code := run(args...)
					m := regexp.MustCompile(`retried (\d+)\b.*skipped (\d+) already done`).FindStringSubmatch(out)
					if code != 0 || m == nil {
						rec.Problem("runbook step 3 %q: exit %d, no 'retried N … skipped M already done' in %q", s.text, code, out)
						break
					}
					n, _ := strconv.Atoi(m[1])
					rec.Extra("cli_retried", n)
					if n != perUser*len(cli) {
						rec.Problem("runbook step 3: retried %d, want the failing users' %d letters", n, perUser*len(cli))
					}
				}
			}
			if err := waitDelivered(ctx, p, p.feeder, cli, 2*time.Minute); err != nil {
				rec.Problem("after kfpipectl's retry: %v", err)
			}
			// Step 5: nothing due or in review, the action audited.
			if out, code := run("audit", "--action", "dlq"); code != 0 || !strings.Contains(out, "CRM back") {
				rec.Problem("runbook step 5: the audit log (exit %d) has no action with the reason \"CRM back\": %q", code, out)
			}

			// With the console.
			web := users("rbw", 3)
			if err := breakFor(web); err != nil {
				return err
			}
			fix(web)
			if err := consoleLogin(bctx, p.AdminURL); err != nil {
				return err
			}
			poll := func(what, expr string, within time.Duration) error { return testenv.WaitJS(bctx, what, expr, within) }
			if err := chromedp.Do(bctx,
				chromedp.SetValue(chromedp.CSS("#f-reason"), "downstream_error"),
				chromedp.Click(chromedp.CSS("#f-apply")),
				chromedp.Click(chromedp.CSS("#batch-retry")),
			); err != nil {
				return fmt.Errorf("console: filter and retry: %w", err)
			}
			if err := poll("the dry run in the reason dialog", `document.querySelector('#reason-dialog').open
				&& document.querySelector('#dry-run p[data-count]') !== null`, 30*time.Second); err != nil {
				return err
			}
			plan, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS("#dry-run p")))
			if err != nil {
				return fmt.Errorf("console: read the dry run: %w", err)
			}
			rec.Extra("console_dry_run", strconv.Quote(plan))
			if !strings.Contains(plan, strconv.Itoa(perUser*len(web))) || !strings.Contains(plan, strconv.Itoa(len(web))+" user") {
				rec.Problem("console dry run %q: want %d messages of %d users", plan, perUser*len(web), len(web))
			}
			if err := chromedp.Do(bctx,
				chromedp.SendKeys(chromedp.CSS("#reason-text"), "CRM back (console)"),
				chromedp.Click(chromedp.CSS("#reason-ok")),
			); err != nil {
				return fmt.Errorf("console: confirm: %w", err)
			}
			if err := poll("the batch done in the Batches card", `(() => { const r = document.querySelector('#batches tbody tr[data-state]');
				return r !== null && r.dataset.state === "done"; })()`, 2*time.Minute); err != nil {
				return err
			}
			if err := waitDelivered(ctx, p, p.feeder, web, 2*time.Minute); err != nil {
				rec.Problem("after the console's retry: %v", err)
			}
			if out, code := run("audit", "--action", "dlq"); code != 0 || !strings.Contains(out, "CRM back (console)") {
				rec.Problem("runbook step 5 (console): the audit log has no action with the console's reason: %q", out)
			}
			return nil
		})
}

// runbookCommand is one `kfpipectl …` span of the runbook.
type runbookCommand struct {
	text string
	args []string
}

// is reports whether the command's leading words are words.
func (c runbookCommand) is(words ...string) bool {
	if len(c.args) < len(words) {
		return false
	}
	for i, w := range words {
		if c.args[i] != w {
			return false
		}
	}
	return true
}

// has reports whether flag is followed by value among the arguments.
func (c runbookCommand) has(flag, value string) bool {
	for i := 0; i+1 < len(c.args); i++ {
		if c.args[i] == flag && c.args[i+1] == value {
			return true
		}
	}
	return false
}

// fill replaces the runbook's placeholders (R, U: a word of their own).
func (c runbookCommand) fill(values map[string]string) []string {
	out := make([]string, len(c.args))
	for i, a := range c.args {
		if v, ok := values[a]; ok {
			a = v
		}
		out[i] = a
	}
	return out
}

// runbookCommands reads the kfpipectl commands of docs/operations.md's
// "The DLQ is growing: what do I do", in the document's order, and fails
// when the steps the test walks are not all there.
func runbookCommands(t *testing.T) []runbookCommand {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "### The DLQ is growing: what do I do")
	if start < 0 {
		t.Fatal("docs/operations.md has no runbook \"The DLQ is growing: what do I do\"")
	}
	section := doc[start:]
	if end := strings.Index(section[4:], "\n## "); end >= 0 {
		section = section[:end+4]
	}
	section = strings.ReplaceAll(section, "\n", " ")
	var cmds []runbookCommand
	for _, m := range regexp.MustCompile("`kfpipectl ([^`]+)`").FindAllStringSubmatch(section, -1) {
		args, err := splitArgs(m[1])
		if err != nil {
			t.Fatalf("runbook command %q: %v", m[0], err)
		}
		cmds = append(cmds, runbookCommand{text: m[0], args: args})
	}
	for _, want := range [][]string{{"health"}, {"dlq", "ls"}, {"dlq", "retry", "--failure-reason", "downstream_error"}} {
		found := false
		for _, c := range cmds {
			found = found || c.is(want...)
		}
		if !found {
			t.Fatalf("the runbook has no `kfpipectl %s` command", strings.Join(want, " "))
		}
	}
	return cmds
}

// splitArgs splits a command line on spaces, keeping "double quoted" words.
func splitArgs(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, has := false, false
	for _, r := range strings.TrimSpace(s) {
		switch {
		case r == '"':
			in, has = !in, true
		case r == ' ' && !in:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteRune(r)
			has = true
		}
	}
	if in {
		return nil, fmt.Errorf("unbalanced quote")
	}
	if has {
		out = append(out, cur.String())
	}
	return out, nil
}

// buildCtl builds kfpipectl beside the daemons.
func buildCtl(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "kfpipectl")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/kfpipectl")
	cmd.Dir = testenv.RepoRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build kfpipectl: %v\n%s", err, b)
	}
	return out
}
