package obs

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/config"
)

func start(t *testing.T, pprof bool) (*Server, string) {
	t.Helper()
	s := NewServer(ServerConfig{Addr: "127.0.0.1:0", Pprof: pprof}, NewRegistry("test", "v0"), nil)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, "http://" + s.Addr()
}

func fetch(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestReadyzNamesFailingDependency(t *testing.T) {
	s, base := start(t, false)
	s.AddCheck("redis", func(context.Context) error { return nil })
	if code, _ := fetch(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz = %d with healthy deps", code)
	}
	s.AddCheck("kafka", func(context.Context) error { return errors.New("broker transport failure") })
	code, body := fetch(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "kafka: not ready: broker transport failure") || strings.Contains(body, "redis") {
		t.Fatalf("readyz = %d %q", code, body)
	}
}

// TestReadyzDetail: a detail line shows on /readyz without changing its
// status, and an empty one does not show.
func TestReadyzDetail(t *testing.T) {
	s, base := start(t, false)
	msg := ""
	s.AddDetail("dedup", func() string { return msg })
	if code, body := fetch(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("readyz = %d %q with no detail", code, body)
	}
	msg = "3 messages waiting on dedup claims held by other owners"
	if code, body := fetch(t, base+"/readyz"); code != 200 || !strings.Contains(body, "dedup: 3 messages waiting") {
		t.Fatalf("readyz = %d %q, want 200 with the detail", code, body)
	}
	s.AddCheck("kafka", func(context.Context) error { return errors.New("down") })
	if code, body := fetch(t, base+"/readyz"); code != 503 || !strings.Contains(body, "dedup: 3 messages") || !strings.Contains(body, "kafka: not ready") {
		t.Fatalf("readyz = %d %q, want 503 with the failure and the detail", code, body)
	}
}

func TestPprofOffUnlessEnabled(t *testing.T) {
	_, off := start(t, false)
	if code, _ := fetch(t, off+"/debug/pprof/"); code != 404 {
		t.Fatalf("pprof disabled but /debug/pprof/ = %d", code)
	}
	_, on := start(t, true)
	if code, _ := fetch(t, on+"/debug/pprof/"); code != 200 {
		t.Fatalf("pprof enabled but /debug/pprof/ = %d", code)
	}
}

func TestMetricsAndHealthz(t *testing.T) {
	s, base := start(t, false)
	_ = s
	if code, body := fetch(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz = %d %q", code, body)
	}
	code, body := fetch(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, `kfpipe_build_info{daemon="test",version="v0"} 1`) || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics = %d\n%s", code, body)
	}
}

func TestLoggerFormats(t *testing.T) {
	for _, f := range []string{"json", "console"} {
		if _, err := NewLogger(config.Log{Level: "debug", Format: f}, "d"); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if _, err := NewLogger(config.Log{Level: "loud", Format: "json"}, "d"); err == nil {
		t.Fatal("bad level accepted")
	}
}
