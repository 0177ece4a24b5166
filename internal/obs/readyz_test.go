package obs

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func startWith(t *testing.T, c ServerConfig) (*Server, string) {
	t.Helper()
	c.Addr = "127.0.0.1:0"
	s := NewServer(c, NewRegistry("test", "v0"), nil)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, "http://" + s.Addr()
}

// TestReadyzStartingUntilStarted: with Starting, /readyz is 503 while the
// daemon is still registering its checks, even when those registered so
// far pass; after Started it answers from the checks.
func TestReadyzStartingUntilStarted(t *testing.T) {
	s, base := startWith(t, ServerConfig{Starting: true})
	s.AddCheck("kafka", func(context.Context) error { return nil })
	for range 3 {
		if code, body := fetch(t, base+"/readyz"); code != 503 || !strings.Contains(body, "starting") {
			t.Fatalf("before Started: /readyz = %d %q, want 503 starting", code, body)
		}
	}
	s.AddCheck("sync", func(context.Context) error { return errors.New("no cursor yet") })
	s.Started()
	if code, body := fetch(t, base+"/readyz"); code != 503 || !strings.Contains(body, "sync: not ready: no cursor yet") || strings.Contains(body, "starting") {
		t.Fatalf("after Started with a failing check: /readyz = %d %q", code, body)
	}
	s.AddCheck("sync", func(context.Context) error { return nil })
	if code, body := fetch(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("after Started, all passing: /readyz = %d %q", code, body)
	}
}

// TestReadyzAnswersWithinBoundWhileACheckHangs: a check that hangs (a
// paused broker) does not hold /readyz beyond AnswerWithin — well inside
// Kubernetes' default 1 s probe timeout — and once the check's own timeout
// has passed /readyz says it is failing.
func TestReadyzAnswersWithinBoundWhileACheckHangs(t *testing.T) {
	s, base := startWith(t, ServerConfig{ReadyTimeout: 1500 * time.Millisecond, ReadyInterval: 100 * time.Millisecond,
		AnswerWithin: 300 * time.Millisecond})
	var hang atomic.Bool
	s.AddCheck("kafka", func(ctx context.Context) error {
		if hang.Load() {
			<-ctx.Done() // ignores nothing, but answers only at the deadline
			return ctx.Err()
		}
		return nil
	})
	s.AddCheck("stuck", func(ctx context.Context) error {
		if hang.Load() {
			time.Sleep(3 * time.Second) // ignores its context altogether
		}
		return nil
	})
	if code, _ := fetch(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d with passing checks", code)
	}
	hang.Store(true)
	var sawFailing bool
	deadline := time.Now().Add(5 * time.Second)
	for !sawFailing && time.Now().Before(deadline) {
		began := time.Now()
		code, body := fetch(t, base+"/readyz")
		if took := time.Since(began); took > 600*time.Millisecond {
			t.Fatalf("/readyz took %s while a check hangs (bound 300 ms)", took)
		}
		if code == 503 {
			if !strings.Contains(body, "kafka: not ready") || !strings.Contains(body, "stuck: not ready: no answer within 1.5s") {
				t.Fatalf("503 body %q does not name both hanging checks", body)
			}
			sawFailing = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !sawFailing {
		t.Fatal("/readyz never turned 503 while the checks hang")
	}
	hang.Store(false)
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, body := fetch(t, base+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q 3 s after the checks recovered", code, body)
		}
	}
}
