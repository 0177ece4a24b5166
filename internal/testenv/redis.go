package testenv

import (
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// PrivateRedis starts a throw-away redis-server of the test's own on a free
// loopback port (no persistence), with extra command-line arguments (e.g.
// "--maxmemory-policy", "allkeys-lru"), and returns its address. It is
// killed at cleanup. A test may reconfigure it freely without disturbing
// the shared Redis.
func PrivateRedis(t testing.TB, args ...string) string {
	t.Helper()
	bin := Tool(t, "redis-server")
	port := FreePort(t)
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for reachable(addr) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("private redis-server on %s not reachable", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}
