package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	brokers := testenv.KafkaBrokers(t)
	_, prefix := testenv.Redis(t)
	mainTopic, dlqTopic := testenv.Topic(t, 4), testenv.Topic(t, 2)
	sink := testenv.FreeAddr(t)
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
	root := testenv.RepoRoot(t)
	cfgPath := filepath.Join(root, "config", "test.yaml")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := filepath.Join(t.TempDir(), "kf-loadgen")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cfg, err := config.LoadConsumer(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	base, err := daemon.Start(ctx, "schedule-consumer", cfg.Common)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close(context.Background())
	cons, err := service.StartConsumer(ctx, cfg, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close(context.Background())

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
	if !res.OK || res.Sent < 100 || res.Report.Handled == 0 || refused == 0 || res.Report.Handled+refused != res.Sent {
		t.Fatalf("summary %s\n%s", out, stderr.String())
	}
}
