package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// EnvFull selects the full-size scenarios (scripts/chaos.sh sets it).
const EnvFull = "KFPIPE_CHAOS_FULL"

// EnvReport, when set, names a file every scenario line is appended to.
const EnvReport = "KFPIPE_CHAOS_REPORT"

// Full reports whether the full-size suite was asked for.
func Full() bool {
	v := os.Getenv(EnvFull)
	return v != "" && v != "0" && v != "false"
}

// Size returns full in the full suite and reduced otherwise.
func Size[T any](reduced, full T) T {
	if Full() {
		return full
	}
	return reduced
}

// SkipUnlessFull skips scenarios that only run in the full suite.
func SkipUnlessFull(t *testing.T) {
	t.Helper()
	if !Full() {
		t.Skipf("full-size scenario: run with %s=1 (make chaos)", EnvFull)
	}
}

// Services are the shared test services and tools a scenario needs.
type Services struct {
	Brokers string // shared Kafka
	Redis   string // shared Redis
	Kcat    string // kcat binary
}

// NeedServices returns the shared Kafka, Redis and kcat (failing under CI
// and skipping otherwise when one is missing) and builds the daemons.
func NeedServices(t *testing.T) Services {
	t.Helper()
	s := Services{Brokers: testenv.KafkaBrokers(t), Redis: testenv.RedisAddr(t), Kcat: testenv.Tool(t, "kcat")}
	binDir(t)
	return s
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// binDir builds the three daemons once per test binary run (go build
// caches, so later runs are quick) and returns the directory holding them.
func binDir(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		began := time.Now()
		defer func() { t.Logf("daemons built in %s", time.Since(began).Round(time.Millisecond)) }()
		buildDir, buildErr = os.MkdirTemp("", "kfpipe-chaos-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+string(filepath.Separator),
			"./cmd/kf-producer", "./cmd/schedule-consumer", "./cmd/dlq-consumer")
		cmd.Dir = testenv.RepoRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build daemons: %v", buildErr)
	}
	return buildDir
}

// removeBinaries deletes what binDir built (TestMain calls it).
func removeBinaries() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// Node is a private service node started by a project script, so a
// scenario can kill it without disturbing the shared services.
type Node struct {
	t      testing.TB
	script string // redis.sh or kafka.sh
	name   string
	Addr   string
	runDir string
	env    []string
}

func (n *Node) run(args ...string) error {
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(n.t), "scripts", n.script), append(args, "--name", n.name)...)
	cmd.Dir = testenv.RepoRoot(n.t)
	cmd.Env = append(os.Environ(), n.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/%s %s --name %s: %v\n%s", n.script, strings.Join(args, " "), n.name, err, out)
	}
	return nil
}

// Kill9 SIGKILLs the node.
func (n *Node) Kill9() error { return n.run("kill9") }

// Stop stops the node gracefully.
func (n *Node) Stop() error { return n.run("stop") }

// Resume starts the node again on its old data and waits until it answers.
func (n *Node) Resume() error { return n.run("resume") }

func startNode(t *testing.T, script, kind string, port int, env []string, startArgs ...string) *Node {
	t.Helper()
	// The run directory is registered before the stop below, so cleanup
	// stops the node first and removes its files afterwards.
	n := &Node{t: t, script: script, name: "chaos-" + testenv.Short(), runDir: t.TempDir(),
		Addr: "127.0.0.1:" + strconv.Itoa(port)}
	n.env = append([]string{"KFPIPE_RUN_DIR=" + n.runDir}, env...)
	t.Cleanup(func() {
		if err := n.run("stop"); err != nil {
			t.Logf("stop private %s: %v", kind, err)
		}
	})
	start := time.Now()
	if err := n.run(append([]string{"start", "--port", strconv.Itoa(port)}, startArgs...)...); err != nil {
		t.Fatalf("private %s: %v", kind, err)
	}
	t.Logf("private %s %s on %s ready in %s", kind, n.name, n.Addr, time.Since(start).Round(time.Millisecond))
	return n
}

// PrivateRedis starts a Redis of the scenario's own. With aof, writes are
// appended and fsync'd before Redis answers (appendfsync always), so a
// kill -9 loses nothing acknowledged — how production runs Redis for
// dedup keys and cursors; without it a kill -9 wipes every key.
func PrivateRedis(t *testing.T, aof bool) *Node {
	t.Helper()
	testenv.Tool(t, "redis-server")
	var env []string
	if aof {
		env = append(env, "KFPIPE_REDIS_EXTRA_CONF=appendonly yes\nappendfsync always")
	}
	return startNode(t, "redis.sh", "redis", testenv.FreePort(t), env)
}

// PrivateKafka starts a single-node Kafka of the scenario's own.
func PrivateKafka(t *testing.T) *Node {
	t.Helper()
	testenv.Tool(t, "java")
	return startNode(t, "kafka.sh", "kafka", testenv.FreePortPair(t), nil)
}
