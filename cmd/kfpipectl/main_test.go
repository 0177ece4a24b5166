package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// result is one kfpipectl run.
type result struct {
	code        int
	out, errOut string
}

// ctl runs kfpipectl in-process with the given environment.
type ctl struct {
	t   *testing.T
	env map[string]string
}

func (c ctl) run(args ...string) result {
	c.t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, &out, &errOut, func(k string) string { return c.env[k] })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}

// must runs args and fails unless they exit with code.
func (c ctl) must(code int, args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != code {
		c.t.Fatalf("kfpipectl %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.out, r.errOut)
	}
	return r
}

func (c ctl) with(k, v string) ctl {
	env := map[string]string{}
	for a, b := range c.env {
		env[a] = b
	}
	env[k] = v
	return ctl{t: c.t, env: env}
}

func jsonOf(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.out), v); err != nil {
		t.Fatalf("output %q is not JSON: %v", r.out, err)
	}
}

func contains(t *testing.T, r result, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(r.out, s) {
			t.Errorf("output lacks %q:\n%s", s, r.out)
		}
	}
}

// startDLQConsumer starts a real dlq-consumer (Kafka, Redis) with its admin
// API and returns it with the DLQ producer that feeds it; edit adjusts its
// configuration.
func startDLQConsumer(t *testing.T, edit ...func(*config.DLQConsumer)) (*service.DLQ, *config.DLQConsumer, *dlq.Producer) {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	_, prefix := testenv.Redis(t)
	mainTopic, dlqTopic := testenv.Name(t, "main"), testenv.Name(t, "dlq")
	t.Cleanup(func() {
		_, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{mainTopic, dlqTopic})
	})
	cfg, err := config.LoadDLQConsumer(filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Topics.Main.Name, cfg.Kafka.Topics.DLQ.Name = mainTopic, dlqTopic
	cfg.Kafka.Consumer.GroupID = testenv.Name(t, "gdlq")
	cfg.Redis.Addr = testenv.RedisAddr(t)
	cfg.Redis.KeyPrefix = prefix
	cfg.Ops.Addr = testenv.FreeAddr(t)
	cfg.Admin.Addr = testenv.FreeAddr(t)
	cfg.DLQ.EmergencyFile = t.TempDir() + "/emergency.jsonl"
	// Retries an hour away: the letters stay as the test leaves them.
	cfg.Recovery.BaseDelay, cfg.Recovery.MaxDelay = time.Hour, 2*time.Hour
	for _, e := range edit {
		e(cfg)
	}

	ctx, cancel := context.WithCancel(context.Background())
	base, err := daemon.Start(ctx, "dlq-consumer", cfg.Common)
	if err != nil {
		t.Fatal(err)
	}
	d, err := service.StartDLQ(ctx, cfg, base)
	if err != nil {
		t.Fatal(err)
	}
	// The feeding producer plays a schedule-consumer: its own emergency file.
	pdlq := cfg.DLQ
	pdlq.EmergencyFile = t.TempDir() + "/feeder-emergency.jsonl"
	p, err := dlq.NewProducer(dlq.ProducerConfig{Kafka: cfg.Kafka, DLQ: pdlq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
		defer c()
		_ = p.Close(sctx)
		if err := d.Close(sctx); err != nil {
			t.Errorf("dlq-consumer close: %v", err)
		}
		_ = base.Close(sctx)
		cancel()
	})
	return d, cfg, p
}

// sendLetter dead-letters a text message of user with reason.
func sendLetter(t *testing.T, p *dlq.Producer, topic, user string, reason dlq.Reason, off int64) string {
	t.Helper()
	b, err := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: off, UpstreamMsgID: fmt.Sprintf("up-%d", off), OpenKfID: "wk-1",
		ExternalUserID: user, MsgType: "text", SendTime: time.Now().Unix(), Content: []byte(`{"text":{"content":"hello ` + user + `"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: topic, Offset: off, Timestamp: time.Now(), Key: []byte(user), Value: b},
		reason, "test failure", time.Now())
	ch := make(chan error, 1)
	p.Send(dl, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("send dead letter: %v", err)
	}
	return dl.ID
}

// TestCommandsAgainstDLQConsumer runs every kfpipectl subcommand against a
// real dlq-consumer and checks outputs, exit codes and that writes happen
// only when asked (not with --dry-run, not with a viewer token).
func TestCommandsAgainstDLQConsumer(t *testing.T) {
	d, cfg, p := startDLQConsumer(t)
	opTok, viewTok := cfg.Admin.Tokens[0].Token, cfg.Admin.Tokens[1].Token
	mainTopic := cfg.Kafka.Topics.Main.Name
	a := sendLetter(t, p, mainTopic, "u1", dlq.ReasonRateLimited, 1)
	b := sendLetter(t, p, mainTopic, "u1", dlq.ReasonRateLimited, 2)
	c := sendLetter(t, p, mainTopic, "u2", dlq.ReasonInvalidMessage, 3)
	dd := sendLetter(t, p, mainTopic, "u3", dlq.ReasonDownstreamError, 4)

	op := ctl{t: t, env: map[string]string{"KFPIPE_ADMIN_URL": d.AdminURL, "KFPIPE_TOKEN": opTok}}
	viewer := op.with("KFPIPE_TOKEN", viewTok)

	// health, as JSON until the letters are indexed, then as a table.
	var h health
	deadline := time.Now().Add(60 * time.Second)
	for {
		jsonOf(t, viewer.must(0, "health", "-o", "json"), &h)
		if h.DLQ.Total == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead letters not indexed: health %+v", h)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if h.Status != "attention" || h.ReviewBacklog != 1 || h.BlockedUsers != 0 {
		t.Errorf("health %+v, want attention with 1 in review, 0 blocked", h)
	}
	healthOut := viewer.must(0, "health")
	contains(t, healthOut, "VERDICT", "consumer_lag", "dlq status", "attention", "review backlog", "dlq rate_limited",
		"active actors", "ACCOUNT", "HORIZON LEFT", "PARTITION", "COMMIT AGE", "CONSUMER")
	// The verdict leads: an on-call person reads the first line as the answer.
	if !strings.HasPrefix(healthOut.out, "VERDICT") || !strings.Contains(strings.SplitN(healthOut.out, "\n", 2)[0], " since ") {
		t.Errorf("health does not lead with the verdict and since when:\n%s", healthOut.out)
	}

	// dlq ls: table and JSON, filtered.
	contains(t, viewer.must(0, "dlq", "ls"), "ID", a, b, c, dd, "invalid_message", "hello u2")
	var page struct {
		Messages []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"messages"`
	}
	jsonOf(t, viewer.must(0, "dlq", "ls", "--user", "u1", "--output", "json"), &page)
	if len(page.Messages) != 2 {
		t.Errorf("ls --user u1: %+v, want 2 letters", page.Messages)
	}
	if r := viewer.must(0, "dlq", "ls", "--limit", "1"); !strings.Contains(r.errOut, "--cursor") {
		t.Errorf("ls --limit 1 gives no next cursor: %q", r.errOut)
	}
	viewer.must(2, "dlq", "ls", "--review", "maybe")
	viewer.must(2, "dlq", "ls", "--limit", "9999") // the API's 400

	// dlq show.
	contains(t, viewer.must(0, "dlq", "show", c), c, "invalid_message", "u2", "message:", "hello u2")
	var shown struct {
		ID      string          `json:"id"`
		Message json.RawMessage `json:"message"`
	}
	jsonOf(t, viewer.must(0, "dlq", "show", a, "-o", "json"), &shown)
	if shown.ID != a || len(shown.Message) == 0 {
		t.Errorf("show -o json: %+v", shown)
	}
	viewer.must(3, "dlq", "show", "no-such-letter")
	viewer.must(2, "dlq", "show")

	// Writes refused to the viewer, with or without reason checks passing.
	viewer.must(4, "dlq", "retry", a, "--why", "viewer tries")
	viewer.must(4, "dlq", "purge", "--user", "u3", "--why", "viewer tries")
	viewer.must(4, "dlq", "purge", "--user", "u3", "--why", "viewer tries", "--dry-run")
	viewer.must(4, "ratelimit", "block", "u9", "--why", "viewer tries")

	// dlq retry: usage errors, dry runs, one, conflict.
	op.must(2, "dlq", "retry", a) // no --why
	// The audit note was --reason, too close to --failure-reason (the
	// DLQ filter): still taken, hidden from the help, with a warning.
	if r := op.must(0, "dlq", "retry", a, "--reason", "check", "--dry-run"); !strings.Contains(r.out, "dry run: would retry "+a) ||
		!strings.Contains(r.errOut, "--reason is deprecated: use --why") {
		t.Errorf("--reason: stdout %q stderr %q, want the dry run and a deprecation warning", r.out, r.errOut)
	}
	op.must(2, "dlq", "retry", a, "--why", "x", "--reason", "y", "--dry-run")
	if r := op.must(0, "dlq", "retry", "--help"); !strings.Contains(r.out, "--why") || strings.Contains(r.out, "--reason") ||
		!strings.Contains(r.out, "--failure-reason") {
		t.Errorf("dlq retry --help shows --why and --failure-reason, not --reason:\n%s", r.out)
	}
	op.must(2, "dlq", "retry", "--why", "x")
	op.must(2, "dlq", "retry", a, "--user", "u1", "--why", "x")
	contains(t, op.must(0, "dlq", "retry", a, "--why", "check", "--dry-run"), "dry run: would retry "+a)
	op.must(3, "dlq", "retry", "no-such-letter", "--why", "check", "--dry-run")
	var count struct {
		Count  int  `json:"count"`
		DryRun bool `json:"dry_run"`
	}
	jsonOf(t, op.must(0, "dlq", "retry", "--user", "u1", "--why", "how many", "--dry-run", "-o", "json"), &count)
	if count.Count != 2 || !count.DryRun {
		t.Errorf("batch retry dry run: %+v, want 2", count)
	}
	jsonOf(t, op.must(0, "dlq", "ls", "--user", "u1", "-o", "json"), &page)
	for _, m := range page.Messages {
		if m.State != "due" {
			t.Errorf("after dry runs letter %s is %s, want due (untouched)", m.ID, m.State)
		}
	}
	contains(t, op.must(0, "dlq", "retry", a, "--why", "limiter fixed"), "retried "+a)

	// invalid_message: not retried unless asked, the dry run saying what
	// the real call does, for one letter and for a batch alike; nothing
	// to retry is exit 5, not 0.
	op.must(4, "dlq", "retry", c, "--why", "invalid cannot be retried")
	op.must(4, "dlq", "retry", c, "--why", "would it?", "--dry-run")
	contains(t, op.must(5, "dlq", "retry", "--user", "u2", "--why", "how many", "--dry-run"),
		"would retry 0 dead letter(s)", "1 never retried (invalid_message or handler_rejected: add --include-invalid")
	if r := op.must(5, "dlq", "retry", "--user", "u2", "--why", "how many"); !strings.Contains(r.errOut, "nothing to retry") {
		t.Errorf("batch of nothing: %q", r.errOut)
	}
	contains(t, op.must(0, "dlq", "retry", "--user", "u2", "--include-invalid", "--why", "handler fixed", "--dry-run"),
		"would retry 1 dead letter(s): 1 message(s) of 1 user(s)")
	contains(t, op.must(0, "dlq", "retry", c, "--include-invalid", "--why", "handler fixed", "--dry-run"), "dry run: would retry "+c)
	contains(t, op.must(0, "dlq", "retry", c, "--include-invalid", "--why", "handler fixed"), "retried "+c)
	op.must(2, "dlq", "retry", "--unblock", "--failure-reason", "rate_limited", "--why", "x")

	// dlq purge: dry run counts and keeps, then the real one.
	contains(t, op.must(0, "dlq", "purge", "--user", "u3", "--why", "noise", "--dry-run"), "would purge 1 dead letter")
	contains(t, viewer.must(0, "dlq", "ls", "--user", "u3"), dd)
	contains(t, op.must(0, "dlq", "purge", "--user", "u3", "--why", "noise"), "purged 1 dead letter")
	if r := viewer.must(0, "dlq", "ls", "--user", "u3"); strings.Contains(r.out, dd) {
		t.Errorf("purged letter still listed:\n%s", r.out)
	}
	op.must(2, "dlq", "purge", "--why", "no filter")
	op.must(2, "dlq", "purge", "--user", "u3")
	op.must(2, "dlq", "purge", "--user", "u1", "--limit", "1", "--why", "purge has no limit")

	// A batch without waiting, followed, listed, cancelled once ended: u1's
	// letter that was not retried (the one retried above is never
	// selected again, neither while due now nor once re-injected).
	for deadline := time.Now().Add(20 * time.Second); ; {
		var m console.DLQMessage
		jsonOf(t, viewer.must(0, "dlq", "show", a, "-o", "json"), &m)
		if m.State == "retried" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("letter %s still %s 20 s after its retry", a, m.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r0 := op.must(0, "dlq", "retry", "--user", "u1", "--why", "the rest of u1", "--wait=false")
	contains(t, r0, "batch ", "started: retry 1 dead letter(s)")
	id := strings.Fields(strings.TrimPrefix(r0.out, "batch "))[0]
	contains(t, viewer.must(0, "dlq", "batch", id, "--wait"), "retried 1 dead letter(s)", id, "done")
	contains(t, viewer.must(0, "dlq", "batch", id), "retry done, 1/1 letters", "the rest of u1")
	contains(t, viewer.must(0, "dlq", "batches"), id, "retry", "done", "1/1", "user=u1")
	// A second batch over the same letters finds nothing to retry.
	contains(t, op.must(5, "dlq", "retry", "--user", "u1", "--why", "again", "--dry-run"), "would retry 0 dead letter(s)")
	op.must(4, "dlq", "cancel", id, "--why", "too late") // 409: it ended
	viewer.must(4, "dlq", "cancel", id, "--why", "viewer tries")
	op.must(2, "dlq", "cancel", id) // no --reason
	op.must(3, "dlq", "batch", "no-such-batch")

	// dlq export: JSON lines to stdout, CSV to a file.
	r := viewer.must(0, "dlq", "export", "--format", "json", "--user", "u2")
	if lines := strings.Split(strings.TrimSpace(r.out), "\n"); len(lines) != 1 || !strings.Contains(lines[0], c) {
		t.Errorf("export json: %q", r.out)
	}
	file := filepath.Join(t.TempDir(), "dlq.csv")
	viewer.must(0, "dlq", "export", "--user", "u1", "--file", file)
	if data, err := os.ReadFile(file); err != nil || !strings.Contains(string(data), a) || !strings.Contains(string(data), b) {
		t.Errorf("export csv file: %q %v", data, err)
	}
	viewer.must(2, "dlq", "export", "--format", "xml")

	// ratelimit: block (dry run first), status, blocked, group, unblock.
	contains(t, op.must(0, "ratelimit", "block", "u9", "--for", "2h", "--why", "spam", "--dry-run"), "would block u9 for 2h0m0s")
	contains(t, viewer.must(0, "ratelimit", "status", "u9"), "u9", "normal", "no")
	contains(t, op.must(0, "ratelimit", "block", "u9", "--for", "2h", "--why", "spam"), "done: block u9")
	var st struct {
		Blocked bool   `json:"blocked"`
		Group   string `json:"group"`
	}
	jsonOf(t, viewer.must(0, "ratelimit", "status", "u9", "-o", "json"), &st)
	if !st.Blocked {
		t.Error("u9 not blocked after block")
	}
	contains(t, viewer.must(0, "ratelimit", "blocked"), "u9", "until")
	op.must(2, "ratelimit", "block", "u9", "--for", "soon", "--why", "x")
	op.must(0, "ratelimit", "unblock", "u9", "--why", "false positive", "--dry-run")
	jsonOf(t, viewer.must(0, "ratelimit", "status", "u9", "-o", "json"), &st)
	if !st.Blocked {
		t.Error("u9 unblocked by a dry run")
	}
	op.must(0, "ratelimit", "unblock", "u9", "--why", "false positive")
	op.must(0, "ratelimit", "group", "u9", "vip", "--why", "partner")
	jsonOf(t, viewer.must(0, "ratelimit", "status", "u9", "-o", "json"), &st)
	if st.Blocked || st.Group != "vip" {
		t.Errorf("u9 status %+v, want unblocked in vip", st)
	}
	op.must(2, "ratelimit", "group", "u9", "no-such-group", "--why", "x")

	// audit: the writes, newest first, with who and result; refused and
	// rejected requests left nothing.
	var audit struct {
		Entries []console.AuditEntry `json:"entries"`
	}
	jsonOf(t, viewer.must(0, "audit", "--limit", "500", "-o", "json"), &audit)
	var got []string
	for _, e := range audit.Entries {
		got = append(got, e.Who+" "+e.Action+" "+e.Result)
	}
	want := []string{
		"test-operator ratelimit.set_group ok", "test-operator ratelimit.unblock ok", "test-operator ratelimit.block ok",
		"test-operator dlq.batch_cancel conflict", "test-operator dlq.batch_retry dry_run", "test-operator dlq.batch_retry ok",
		"test-operator dlq.purge ok", "test-operator dlq.purge dry_run",
		"test-operator dlq.retry ok", "test-operator dlq.retry dry_run", "test-operator dlq.batch_retry dry_run",
		"test-operator dlq.batch_retry ok", "test-operator dlq.batch_retry dry_run", // u2: nothing, then with --include-invalid
		"test-operator dlq.retry dry_run_conflict", "test-operator dlq.retry conflict", // a refused dry run stays a dry run
		"test-operator dlq.retry ok", "test-operator dlq.batch_retry dry_run",
		"test-operator dlq.retry dry_run_not_found", "test-operator dlq.retry dry_run", // one letter's dry runs ask the API too
		"test-operator dlq.retry dry_run", // the deprecated --reason's
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	contains(t, viewer.must(0, "audit"), "WHO", "dlq.purge", "noise")
	if r := viewer.must(0, "audit", "--action", "ratelimit"); strings.Contains(r.out, "dlq.") || !strings.Contains(r.out, "ratelimit.block") {
		t.Errorf("audit --action ratelimit:\n%s", r.out)
	}
	if r := viewer.must(0, "audit", "--target", "batch="); strings.Count(r.out, "dlq.batch_retry") != 1 || strings.Contains(r.out, "ratelimit") {
		t.Errorf("audit --target batch=:\n%s", r.out)
	}

	// Rules: read with their version, replaced by compare-and-set; a change
	// against an older version is refused (exit 4) and changes nothing.
	contains(t, viewer.must(0, "ratelimit", "rules"), "version 0 (backend redis)", "GROUP", "normal")
	rulesFile := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(rulesFile, []byte(`{"normal": {"window_seconds": 10, "max_messages": 2, "penalty_threshold": 3, "block_hours": 1},
		"whitelist": {"window_seconds": 1, "max_messages": 9999, "penalty_threshold": 9999, "block_hours": 0}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	op.must(2, "ratelimit", "set-rules", "--file", rulesFile, "--why", "no version")
	contains(t, op.must(0, "ratelimit", "set-rules", "--file", rulesFile, "--version", "0", "--why", "x", "--dry-run"), "dry run")
	contains(t, op.must(0, "ratelimit", "set-rules", "--file", rulesFile, "--version", "0", "--why", "tighten"), "now at version 1")
	if r := op.must(4, "ratelimit", "set-rules", "--file", rulesFile, "--version", "0", "--why", "stale"); !strings.Contains(r.errOut, "read them again") {
		t.Errorf("stale set-rules: %q", r.errOut)
	}
	contains(t, viewer.must(0, "ratelimit", "rules"), "version 1 (backend redis)", "normal")
	viewer.must(4, "ratelimit", "set-rules", "--file", rulesFile, "--version", "1", "--why", "viewer tries")
	// Without coord the fleet is not kept: the API says what to set.
	if r := viewer.must(1, "fleet"); !strings.Contains(r.errOut, "coord.enabled") {
		t.Errorf("fleet without coord: %q", r.errOut)
	}

	// Token and server handling.
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(viewTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noTok := op.with("KFPIPE_TOKEN", "")
	noTok.must(0, "health", "--token-file", tokFile)
	noTok.must(2, "health")
	noTok.must(2, "health", "--token-file", filepath.Join(t.TempDir(), "missing"))
	op.with("KFPIPE_TOKEN", "not-a-configured-token").must(4, "health")
	op.must(0, "health", "--server", d.AdminURL+"/")
	op.with("KFPIPE_ADMIN_URL", "").must(2, "health", "--server", "localhost:8090")
	op.must(2, "health", "--output", "yaml")
	op.must(2, "no-such-command")

	// Shell completion.
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if r := op.must(0, "completion", sh); !strings.Contains(r.out, "kfpipectl") {
			t.Errorf("completion %s: %q", sh, r.out[:min(len(r.out), 200)])
		}
	}
	if r := op.must(0, "__complete", "dlq", "ls", "--failure-reason", ""); !strings.Contains(r.out, "rate_limited") {
		t.Errorf("flag completion: %q", r.out)
	}
}

// TestServerDown: an unreachable server is exit 1, not a usage error.
func TestServerDown(t *testing.T) {
	c := ctl{t: t, env: map[string]string{"KFPIPE_TOKEN": "some-token-0123456789", "KFPIPE_ADMIN_URL": "http://" + testenv.FreeAddr(t)}}
	r := c.must(1, "health")
	if !strings.Contains(r.errOut, "admin API") {
		t.Errorf("stderr %q does not say what it tried", r.errOut)
	}
}

// TestRetryInvalidMessageLetters is the field run's invalid_message case
// against a real dlq-consumer: a user's 15 letters whose reason is never
// retried, invalid_message and handler_rejected (the bot refused the
// message for good) in turn (the field run's 20 less what the DLQ's
// per-user pacing holds for a minute: the batch ends when its last letter
// is back in the main topic), listed by dlq ls. Without --include-invalid the batch's dry run and the real
// run both find nothing to retry (exit 5, saying why) and one letter's dry
// run and real call both answer 409 (exit 4); with it, the dry run counts
// 15 messages of 1 user and the batch retries exactly those 15, audited
// with include_invalid; a second retry then selects none of them.
func TestRetryInvalidMessageLetters(t *testing.T) {
	d, cfg, p := startDLQConsumer(t)
	op := ctl{t: t, env: map[string]string{"KFPIPE_ADMIN_URL": d.AdminURL, "KFPIPE_TOKEN": cfg.Admin.Tokens[0].Token}}
	var ids []string
	for i := range 15 {
		r := dlq.ReasonInvalidMessage
		if i%2 == 1 {
			r = dlq.ReasonHandlerRejected
		}
		ids = append(ids, sendLetter(t, p, cfg.Kafka.Topics.Main.Name, "U", r, int64(i)))
	}
	var page struct {
		Messages []console.DLQMessage `json:"messages"`
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		jsonOf(t, op.must(0, "dlq", "ls", "--user", "U", "-o", "json"), &page)
		if len(page.Messages) == 15 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 15 letters listed", len(page.Messages))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Not asked for: nothing retried, the same answer dry or not.
	contains(t, op.must(5, "dlq", "retry", "--user", "U", "--why", "how many", "--dry-run"),
		"would retry 0 dead letter(s)", "15 never retried")
	if r := op.must(5, "dlq", "retry", "--user", "U", "--why", "try"); !strings.Contains(r.errOut, "nothing to retry: the filter selects 15 dead letter(s)") ||
		!strings.Contains(r.errOut, "--include-invalid") {
		t.Errorf("batch without --include-invalid: %q", r.errOut)
	}
	for _, id := range ids[:2] { // invalid_message, handler_rejected
		for _, dry := range []string{"--dry-run=true", "--dry-run=false"} {
			if r := op.must(4, "dlq", "retry", id, "--why", "one", dry); !strings.Contains(r.errOut, "include_invalid") {
				t.Errorf("one letter %s %s: %q", id, dry, r.errOut)
			}
		}
	}
	jsonOf(t, op.must(0, "dlq", "ls", "--user", "U", "-o", "json"), &page)
	for _, m := range page.Messages {
		if m.State != "review" {
			t.Fatalf("letter %s is %s after retries that retried nothing", m.ID, m.State)
		}
	}

	// Asked for: the dry run's count is what the batch retries; it warns
	// that U is blocked, and unblock-and-retry is one step.
	op.must(0, "ratelimit", "block", "U", "--for", "1h", "--why", "looked like a bot")
	var plan console.BatchPlan
	jsonOf(t, op.must(0, "dlq", "retry", "--user", "U", "--include-invalid", "--why", "handler fixed", "--dry-run", "-o", "json"), &plan)
	if plan.Count != 15 || plan.Messages != 15 || plan.Users != 1 || plan.NotRetryable != 0 || len(plan.Blocked) != 1 {
		t.Fatalf("dry run with --include-invalid: %+v, want 15 messages of 1 user, blocked", plan)
	}
	contains(t, op.must(0, "dlq", "retry", "--user", "U", "--include-invalid", "--why", "handler fixed", "--dry-run"),
		"warning: 1 of these users are blocked", "--unblock")
	contains(t, op.must(0, "dlq", "retry", "--user", "U", "--include-invalid", "--unblock", "--why", "handler fixed"),
		"unblocked U", "retried 15 dead letter(s)", "15 back in the main topic")
	var st struct {
		Blocked bool `json:"blocked"`
	}
	if jsonOf(t, op.must(0, "ratelimit", "status", "U", "-o", "json"), &st); st.Blocked {
		t.Errorf("U still blocked after --unblock")
	}
	// Acted on: never selected again (due now, then retried).
	contains(t, op.must(5, "dlq", "retry", "--user", "U", "--include-invalid", "--why", "again", "--dry-run"),
		"would retry 0 dead letter(s)")
	op.must(4, "dlq", "retry", ids[0], "--include-invalid", "--why", "again")

	var audit struct {
		Entries []console.AuditEntry `json:"entries"`
	}
	jsonOf(t, op.must(0, "audit", "--target", "include_invalid", "-o", "json"), &audit)
	if len(audit.Entries) != 5 {
		t.Errorf("%d audit entries name include_invalid, want 5 (two dry runs, the batch, a dry run, one letter)", len(audit.Entries))
	}
	for _, e := range audit.Entries {
		if e.Action == "dlq.batch_retry" && e.Result == "ok" && !strings.Contains(e.Target, "include_invalid unblock batch=") {
			t.Errorf("the unblock-and-retry's audit target %q", e.Target)
		}
	}
}
