package daemon_test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestDaemonsServeAndStopOnSIGTERM builds each daemon, starts it with the
// shipped development config against the test services, checks /healthz
// and /metrics, and expects exit status 0 within 10 s of SIGTERM.
func TestDaemonsServeAndStopOnSIGTERM(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	root := testenv.RepoRoot(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/kf-producer", "./cmd/schedule-consumer", "./cmd/dlq-consumer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, name := range []string{"kf-producer", "schedule-consumer", "dlq-consumer"} {
		t.Run(name, func(t *testing.T) {
			ops := testenv.FreeAddr(t)
			cmd := exec.Command(filepath.Join(bin, name), "--config", "config/development.yaml")
			cmd.Dir = root
			cmd.Env = append(os.Environ(),
				"KFPIPE_OPS_ADDR="+ops,
				"KFPIPE_CALLBACK_ADDR="+testenv.FreeAddr(t),
				"KFPIPE_ADMIN_ADDR="+testenv.FreeAddr(t),
				"KFPIPE_KAFKA_BROKERS="+brokers,
				"KFPIPE_REDIS_ADDR="+redisAddr,
				"KFPIPE_REDIS_KEY_PREFIX="+testenv.Name(t, "rd")+":",
				"KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(t.TempDir(), "emergency.jsonl"),
			)
			var logs strings.Builder
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
				}
			}()

			base := "http://" + ops
			deadline := time.Now().Add(60 * time.Second)
			for {
				if body, code := get(base + "/healthz"); code == 200 && strings.Contains(body, "ok") {
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("%s exited early: %v\n%s", name, err, logs.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: /healthz not up\n%s", name, logs.String())
				}
				time.Sleep(100 * time.Millisecond)
			}
			body, code := get(base + "/metrics")
			if code != 200 || !strings.Contains(body, "kfpipe_build_info") {
				t.Fatalf("/metrics = %d, missing kfpipe_build_info", code)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("%s exit after SIGTERM: %v\n%s", name, err, logs.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not exit within 10 s of SIGTERM\n%s", name, logs.String())
			}
		})
	}
}

func get(url string) (string, int) {
	resp, err := http.Get(url)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}
