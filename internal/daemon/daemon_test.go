package daemon_test

import (
	"io"
	"net"
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
			ops, callback := testenv.FreeAddr(t), testenv.FreeAddr(t)
			cmd := exec.Command(filepath.Join(bin, name), "--config", "config/development.yaml")
			cmd.Dir = root
			cmd.Env = append(os.Environ(),
				"KFPIPE_OPS_ADDR="+ops,
				"KFPIPE_CALLBACK_ADDR="+callback,
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
			// /readyz: 503 until the daemon is started; its first 200 comes
			// with kf-producer's callback port already listening.
			for {
				body, code := get(base + "/readyz")
				if code == 200 {
					if body != "ready\n" {
						t.Fatalf("/readyz 200 with %q", body)
					}
					if name == "kf-producer" {
						c, err := net.DialTimeout("tcp", callback, time.Second)
						if err != nil {
							t.Fatalf("/readyz 200 before the callback port listens: %v", err)
						}
						c.Close()
					}
					break
				}
				if code != 503 || time.Now().After(deadline) {
					t.Fatalf("%s: /readyz = %d %q\n%s", name, code, body, logs.String())
				}
				time.Sleep(20 * time.Millisecond)
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

// TestRefusesEvictingRedis: a daemon against a Redis whose
// maxmemory-policy may evict its keys exits at start-up with a message
// naming the setting, before it serves; with
// redis.skip_eviction_policy_check it starts, warning loudly.
func TestRefusesEvictingRedis(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.PrivateRedis(t, "--maxmemory-policy", "allkeys-lru")
	root := testenv.RepoRoot(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/schedule-consumer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	run := func(extra ...string) (*exec.Cmd, *strings.Builder, string) {
		ops := testenv.FreeAddr(t)
		cmd := exec.Command(filepath.Join(bin, "schedule-consumer"), "--config", "config/development.yaml")
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(),
			"KFPIPE_OPS_ADDR="+ops,
			"KFPIPE_KAFKA_BROKERS="+brokers,
			"KFPIPE_REDIS_ADDR="+redisAddr,
			"KFPIPE_REDIS_KEY_PREFIX="+testenv.Name(t, "ev")+":",
			"KFPIPE_DLQ_EMERGENCY_FILE="+filepath.Join(t.TempDir(), "emergency.jsonl"),
		), extra...)
		var logs strings.Builder
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		return cmd, &logs, "http://" + ops
	}

	cmd, logs, _ := run()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatalf("exit status 0 against an allkeys-lru Redis\n%s", logs)
		}
		if !strings.Contains(logs.String(), `maxmemory-policy is "allkeys-lru"`) {
			t.Fatalf("the refusal does not name the setting:\n%s", logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60 s after start against an allkeys-lru Redis\n%s", logs)
	}

	cmd, logs, base := run("KFPIPE_REDIS_SKIP_EVICTION_POLICY_CHECK=true")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if body, code := get(base + "/healthz"); code == 200 && strings.Contains(body, "ok") {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("not serving with the override\n%s", logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait() // the logs are complete (and not written any more) only now
	if !strings.Contains(logs.String(), "maxmemory-policy is NOT checked") {
		t.Errorf("the override is not logged loudly:\n%s", logs)
	}
}
