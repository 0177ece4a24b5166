package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestLoadgenAttackKafkaMode runs kf-loadgen (the built binary) with the attack
// profile straight into Kafka against a real schedule-consumer whose http
// handler posts to the loadgen's sink: the run must end verified (nothing
// lost, no duplicate effect, every user in order), with the surplus the
// limiter refuses counted as dead-lettered.
func TestLoadgenAttackKafkaMode(t *testing.T) {
	sink := testenv.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildLoadgen(t)
	cfgPath := startConsumer(t, sink)

	cmd := exec.CommandContext(ctx, bin, "--config", cfgPath, "--profile", "attack", "--users", "5",
		"--duration", "3s", "--drain", "60s", "--mode", "kafka", "--sink", sink)
	cmd.Env = os.Environ()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kf-loadgen: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var res struct {
		Sent   int  `json:"sent"`
		OK     bool `json:"ok"`
		Report struct {
			Handled      int            `json:"handled"`
			Recovered    int            `json:"recovered"`
			DeadLettered map[string]int `json:"dead_lettered"`
		} `json:"report"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	refused := 0
	for _, n := range res.Report.DeadLettered {
		refused += n
	}
	// 5 users at 1000/min for 3 s is ~250 messages; the normal group lets 5
	// per 10 s through per user, the rest goes to the DLQ.
	if !res.OK || res.Sent < 100 || res.Report.Handled == 0 || refused == 0 || res.Report.Handled+refused-res.Report.Recovered != res.Sent {
		t.Fatalf("summary %s\n%s", out, stderr.String())
	}
}

// startConsumer starts a real schedule-consumer on fresh topics whose http
// handler posts to http://sink/sink, and returns the config file whose
// KFPIPE_ environment (set for the test) describes it.
func startConsumer(t *testing.T, sink string) string {
	t.Helper()
	// Cancelled last, after the consumer's Close (cleanups run in reverse).
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	brokers := testenv.KafkaBrokers(t)
	_, prefix := testenv.Redis(t)
	mainTopic, dlqTopic := testenv.Topic(t, 4), testenv.Topic(t, 2)
	env := map[string]string{
		"KFPIPE_KAFKA_BROKERS":           brokers,
		"KFPIPE_KAFKA_TOPICS_MAIN_NAME":  mainTopic,
		"KFPIPE_KAFKA_TOPICS_DLQ_NAME":   dlqTopic,
		"KFPIPE_REDIS_ADDR":              testenv.RedisAddr(t),
		"KFPIPE_REDIS_KEY_PREFIX":        prefix,
		"KFPIPE_KAFKA_CONSUMER_GROUP_ID": testenv.Name(t, "g"),
		"KFPIPE_HANDLER_TYPE":            "http",
		"KFPIPE_HANDLER_HTTP_URL":        "http://" + sink + "/sink",
		"KFPIPE_OPS_ADDR":                testenv.FreeAddr(t),
		"KFPIPE_DLQ_EMERGENCY_FILE":      filepath.Join(t.TempDir(), "emergency.jsonl"),
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfgPath := filepath.Join(testenv.RepoRoot(t), "config", "test.yaml")
	cfg, err := config.LoadConsumer(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	base, err := daemon.Start(ctx, "schedule-consumer", cfg.Common)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { base.Close(context.Background()) })
	cons, err := service.StartConsumer(ctx, cfg, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Close(context.Background()) })
	return cfgPath
}

// buildLoadgen builds the binary once per test.
func buildLoadgen(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kf-loadgen")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestLoadgenExpectThenCheckTopic: a run into real Kafka with --expect
// (no sink: the deployment's receiver would be judged), then check of the
// main topic's content with the DLQ topic: every expected message is on
// the topic once, in each user's order, with a send time of now; a dead
// letter of one of them on the DLQ topic makes check fail, unless its
// reason is allowed.
func TestLoadgenExpectThenCheckTopic(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic, dlqTopic := testenv.Topic(t, 3), testenv.Topic(t, 1)
	for k, v := range map[string]string{
		"KFPIPE_KAFKA_BROKERS":          brokers,
		"KFPIPE_KAFKA_TOPICS_MAIN_NAME": mainTopic,
		"KFPIPE_KAFKA_TOPICS_DLQ_NAME":  dlqTopic,
	} {
		t.Setenv(k, v)
	}
	cfgPath := filepath.Join(testenv.RepoRoot(t), "config", "test.yaml")
	dir := t.TempDir()
	exp := filepath.Join(dir, "expect.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// In process (what main runs), not the built binary: seconds, not a
	// cgo link.
	runCmd := func(args ...string) ([]byte, string, error) {
		var out, stderr strings.Builder
		err := dispatch(ctx, args, &out, &stderr)
		return []byte(out.String()), stderr.String(), err
	}
	begin := time.Now()
	out, stderr, err := runCmd("--config", cfgPath, "--profile", "peak", "--users", "6", "--burst", "2-4",
		"--gap", "exp:150ms", "--duration", "3s", "--mode", "kafka", "--sink", "none", "--expect", exp)
	if err != nil {
		t.Fatalf("kf-loadgen: %v\n%s\n%s", err, out, stderr)
	}
	var gen struct {
		Sent int    `json:"sent"`
		Run  string `json:"run"`
	}
	if err := json.Unmarshal(out, &gen); err != nil || gen.Sent < 6 {
		t.Fatalf("summary %q: %v", out, err)
	}
	expected, err := readExpect(exp)
	if err != nil || len(expected) != gen.Sent {
		t.Fatalf("expected set: %d lines, sent %d: %v", len(expected), gen.Sent, err)
	}
	// Send times are now, not a constant.
	for _, m := range testenv.ReadTopic(t, brokers, mainTopic) {
		cm, err := chatmsg.Decode(m.Value)
		if err != nil {
			t.Fatal(err)
		}
		if st := time.Unix(cm.SendTime, 0); st.Before(begin.Add(-time.Second)) || st.After(time.Now()) {
			t.Fatalf("send_time %s of %s, want within the run (from %s)", st, cm.UpstreamMsgID, begin)
		}
	}

	check := func(extra ...string) (checkResult, string, error) {
		out, stderr, err := runCmd(append([]string{"check", "--config", cfgPath, "--expect", exp, "--record", "topic"}, extra...)...)
		var res checkResult
		if jerr := json.Unmarshal(out, &res); jerr != nil || len(res.Runs) != 1 {
			t.Fatalf("check output %q: %v\n%s", out, jerr, stderr)
		}
		return res, stderr, err
	}
	res, stderr, err := check()
	rv := res.Runs[0]
	if err != nil || !res.OK || rv.Run != gen.Run || rv.Sent != gen.Sent || rv.Effects != gen.Sent || rv.Lost+rv.Dup+rv.Reordered != 0 {
		t.Fatalf("check of a clean run: %v %+v\n%s", err, res, stderr)
	}

	victim := expected[len(expected)/2]
	dl, _ := json.Marshal(map[string]any{"failure_reason": "rate_limited",
		"original_message": map[string]string{"upstream_msgid": victim.MsgID, "external_userid": victim.User}})
	testenv.Produce(t, brokers, dlqTopic, []testenv.Record{{Key: []byte(victim.User), Value: dl}})
	res, stderr, err = check()
	rv = res.Runs[0]
	if err == nil || res.OK || rv.Unexpected != 1 || rv.DeadLettered["rate_limited"] != 1 || rv.Recovered != 1 {
		t.Fatalf("check with a dead letter: err %v %+v\n%s", err, res, stderr)
	}
	if !strings.Contains(stderr, "dead letter: "+victim.MsgID) {
		t.Fatalf("check does not name the dead letter:\n%s", stderr)
	}
	if res, stderr, err = check("--allow-dlq", "rate_limited,user_blocked"); err != nil || !res.OK {
		t.Fatalf("check with an allowed dead letter: %v %+v\n%s", err, res, stderr)
	}
}

// TestSmokeTestOfADeployment runs docs/operations.md's "Smoke test of a
// deployment" against a real schedule-consumer: the receiver (kf-loadgen
// sink, writing its record), traffic with --sink none --expect, then check
// --wait. It passes on a healthy pipeline, and fails when the receiver
// failed a user's messages into the DLQ (an unexpected dead letter).
func TestSmokeTestOfADeployment(t *testing.T) {
	sinkAddr := testenv.FreeAddr(t)
	cfgPath := startConsumer(t, sinkAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	rec, exp := filepath.Join(dir, "rec.jsonl"), filepath.Join(dir, "exp.jsonl")
	sinkCtx, stopSink := context.WithCancel(ctx)
	sinkDone := make(chan error, 1)
	var sinkErr strings.Builder
	go func() {
		sinkDone <- dispatch(sinkCtx, []string{"sink", "--addr", sinkAddr, "--record", rec, "--fail-users", "wmnormal000007"},
			io.Discard, &sinkErr)
	}()
	defer func() {
		stopSink()
		if err := <-sinkDone; err != nil {
			t.Errorf("sink: %v\n%s", err, sinkErr.String())
		}
	}()
	lg := func(args ...string) (string, string, error) {
		var out, stderr strings.Builder
		err := dispatch(ctx, args, &out, &stderr)
		return out.String(), stderr.String(), err
	}
	// 8 users, each a 2-message conversation within the run (user 7's
	// failed by the sink), far inside the limiter's rule.
	out, stderr, err := lg("--config", cfgPath, "--profile", "normal", "--users", "8", "--burst", "2", "--gap", "fixed:100ms",
		"--duration", "4s", "--sink", "none", "--expect", exp, "--seed", "1")
	if err != nil {
		t.Fatalf("generate: %v\n%s\n%s", err, out, stderr)
	}
	expected, err := readExpect(exp)
	if err != nil {
		t.Fatal(err)
	}
	victim := 0
	for _, e := range expected {
		if e.User == "wmnormal000007" {
			victim++
		}
	}
	if victim == 0 {
		t.Fatalf("user 7 sent nothing in the run: %+v", expected)
	}
	out, stderr, err = lg("check", "--config", cfgPath, "--expect", exp, "--record", rec, "--wait", "90s")
	var res checkResult
	_ = json.Unmarshal([]byte(out), &res)
	if err == nil || res.OK || len(res.Runs) != 1 || res.Runs[0].Unexpected != victim || res.Runs[0].DeadLettered["downstream_error"] != victim ||
		res.Runs[0].Lost != 0 || res.Runs[0].Effects != len(expected)-victim {
		t.Fatalf("check with user 7 failing: want ok=false and its %d messages dead-lettered as downstream_error: %v %s\n%s",
			victim, err, out, stderr)
	}
	out, stderr, err = lg("check", "--config", cfgPath, "--expect", exp, "--record", rec, "--allow-dlq", "downstream_error")
	if err != nil || !strings.Contains(stderr, "ok=true") {
		t.Fatalf("check allowing downstream_error: %v %s\n%s", err, out, stderr)
	}
}

// TestRunNotOKOnADeadLetter: a normal run whose sink fails one user ends
// with ok=false and that user's messages as unexpected dead letters (a
// run once reported ok with 4 of 19 messages dead-lettered).
func TestRunNotOKOnADeadLetter(t *testing.T) {
	sinkAddr := testenv.FreeAddr(t)
	cfgPath := startConsumer(t, sinkAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, stderr strings.Builder
	exp := filepath.Join(t.TempDir(), "exp.jsonl")
	err := dispatch(ctx, []string{"--config", cfgPath, "--profile", "normal", "--users", "6", "--burst", "2",
		"--gap", "fixed:100ms", "--duration", "3s", "--drain", "60s", "--sink", sinkAddr, "--fail-users", "wmnormal000002",
		"--expect", exp}, &out, &stderr)
	expected, rerr := readExpect(exp)
	if rerr != nil {
		t.Fatal(rerr)
	}
	victim := 0
	for _, e := range expected {
		if e.User == "wmnormal000002" {
			victim++
		}
	}
	var res struct {
		OK    bool         `json:"ok"`
		Sent  int          `json:"sent"`
		Check []runVerdict `json:"check"`
	}
	if jerr := json.Unmarshal([]byte(out.String()), &res); jerr != nil || len(res.Check) != 1 {
		t.Fatalf("summary %q: %v\n%s", out.String(), jerr, stderr.String())
	}
	rv := res.Check[0]
	if victim == 0 || err == nil || res.OK || rv.Unexpected != victim || rv.DeadLettered["downstream_error"] != victim ||
		rv.Lost != 0 || rv.Effects != res.Sent-victim || !strings.Contains(stderr.String(), "dead letter: ") {
		t.Fatalf("want ok=false with user 2's %d messages dead-lettered: err %v %+v\n%s", victim, err, res, stderr.String())
	}
}
