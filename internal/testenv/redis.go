package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
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

// Tmpfs mounts a tmpfs of size (e.g. "1m") on a temporary directory for
// the test and returns it; unmounted at cleanup. It needs root: with CI
// set, not being able to mount one fails the test.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput()
	if err != nil {
		missing(t, "a tmpfs (mount needs root)", fmt.Errorf("%v: %s", err, out))
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// FillDisk writes a file into dir until its filesystem has no space left,
// and returns its path (remove it to free the space).
func FillDisk(dir string) (string, error) {
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return path, nil
			}
			return "", err
		}
	}
}
