package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Kill is one recorded kill -9 of a daemon incarnation.
type Kill struct {
	Tag string // the incarnation killed, as the Sink sees it ("consumer-1.2")
	At  time.Time
	// Thaw is when a frozen incarnation (Freeze) was resumed; zero for a
	// kill, or a freeze not thawed.
	Thaw time.Time
	// Freeze: a SIGSTOP, not a kill.
	Freeze bool
}

// Daemon is one of the pipeline's processes. It can be started, killed and
// restarted any number of times; each start is a new incarnation with its
// own tag and log file.
type Daemon struct {
	Name string // "producer", "consumer-1", "dlq"

	bin     string
	args    []string
	env     []string
	envFor  func(tag string) []string // per-incarnation variables (the sink URL)
	opsAddr string
	logDir  string
	onKill  func(Kill)
	onThaw  func(tag string, at time.Time)

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{} // closed when the current process exited
	exitErr     error
	expectExit  bool // we signalled it: an exit is not a crash
	incarnation int
	logs        []string
	crashes     []string
}

// Tag is the current incarnation's name.
func (d *Daemon) Tag() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tagLocked()
}

func (d *Daemon) tagLocked() string { return d.Name + "." + strconv.Itoa(d.incarnation) }

// Running reports whether a process is alive.
func (d *Daemon) Running() bool {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Start launches a new incarnation; it does not wait for readiness.
func (d *Daemon) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done != nil {
		select {
		case <-d.done:
		default:
			return fmt.Errorf("%s: already running", d.tagLocked())
		}
	}
	d.incarnation++
	tag := d.tagLocked()
	logPath := filepath.Join(d.logDir, tag+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, d.args...)
	cmd.Env = append(append(append(os.Environ(), d.env...), d.envFor(tag)...), "KFPIPE_OPS_ADDR="+d.opsAddr,
		"GOTRACEBACK=all") // every goroutine in the dump of a hung stop
	cmd.Stdout, cmd.Stderr = lf, lf
	// Own process group: a Ctrl-C of go test does not reach it before our
	// cleanup does, and nothing else is signalled by our kills.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = lf.Close()
		return fmt.Errorf("%s: start: %w", tag, err)
	}
	d.cmd, d.done, d.exitErr, d.expectExit = cmd, make(chan struct{}), nil, false
	d.logs = append(d.logs, logPath)
	done := d.done
	go func() {
		err := cmd.Wait()
		_ = lf.Close()
		d.mu.Lock()
		d.exitErr = err
		if !d.expectExit {
			d.crashes = append(d.crashes, fmt.Sprintf("%s exited by itself: %v", tag, err))
		}
		d.mu.Unlock()
		close(done)
	}()
	return nil
}

// Kill9 SIGKILLs the current incarnation, records the kill and waits until
// the process is gone.
func (d *Daemon) Kill9() (Kill, error) {
	d.mu.Lock()
	cmd, done, tag := d.cmd, d.done, d.tagLocked()
	if cmd == nil || done == nil {
		d.mu.Unlock()
		return Kill{}, fmt.Errorf("%s: not started", d.Name)
	}
	d.expectExit = true
	d.mu.Unlock()
	k := Kill{Tag: tag, At: time.Now()}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return k, fmt.Errorf("%s: kill: %w", tag, err)
	}
	<-done
	if d.onKill != nil {
		d.onKill(k)
	}
	return k, nil
}

// Freeze SIGSTOPs the current incarnation: a zombie that neither works nor
// heartbeats until Thaw. The freeze is recorded like a kill (the judge's
// in-flight window and the users' stall count from it): what the process
// had sent before it froze may have had its effect without its mark.
func (d *Daemon) Freeze() (Kill, error) {
	d.mu.Lock()
	cmd, tag := d.cmd, d.tagLocked()
	d.mu.Unlock()
	if cmd == nil {
		return Kill{}, fmt.Errorf("%s: not started", d.Name)
	}
	k := Kill{Tag: tag, At: time.Now(), Freeze: true}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return k, fmt.Errorf("%s: SIGSTOP: %w", tag, err)
	}
	if d.onKill != nil {
		d.onKill(k)
	}
	return k, nil
}

// Thaw SIGCONTs a frozen incarnation: it resumes where it stopped, with
// its clock jumped forward.
func (d *Daemon) Thaw() error {
	d.mu.Lock()
	cmd, tag := d.cmd, d.tagLocked()
	d.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s: not started", d.Name)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("%s: SIGCONT: %w", tag, err)
	}
	if d.onThaw != nil {
		d.onThaw(tag, time.Now())
	}
	return nil
}

// Stop sends SIGTERM and waits up to timeout for a clean exit. A process
// still alive then is killed, and Stop reports the hang; a non-zero exit
// status is reported too.
func (d *Daemon) Stop(timeout time.Duration) error {
	d.mu.Lock()
	cmd, done, tag := d.cmd, d.done, d.tagLocked()
	if cmd == nil || done == nil {
		d.mu.Unlock()
		return nil
	}
	d.expectExit = true
	d.mu.Unlock()
	select {
	case <-done:
		return nil // already gone
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	start := time.Now()
	select {
	case <-done:
	case <-time.After(timeout):
		// SIGQUIT first: the Go runtime writes every goroutine's stack to
		// the log (dumpLogs shows it), which says where the stop hung.
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
		return fmt.Errorf("%s: still running %s after SIGTERM (killed; its goroutines are in its log)", tag, timeout)
	}
	d.mu.Lock()
	err := d.exitErr
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: exit after SIGTERM in %s: %w", tag, time.Since(start).Round(time.Millisecond), err)
	}
	return nil
}

// Restart starts a new incarnation and waits until it is ready.
func (d *Daemon) Restart(timeout time.Duration) error {
	if err := d.Start(); err != nil {
		return err
	}
	return d.WaitReady(timeout)
}

// OpsURL is the base URL of the ops server (/readyz, /metrics).
func (d *Daemon) OpsURL() string { return "http://" + d.opsAddr }

// Readyz returns /readyz's status and body.
func (d *Daemon) Readyz(ctx context.Context) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.OpsURL()+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

// WaitReady polls /readyz until it answers 200, the process dies or
// timeout passes.
func (d *Daemon) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		if !d.Running() {
			return fmt.Errorf("%s exited while starting; log tail:\n%s", d.Tag(), d.tail(30))
		}
		code, body, err := d.Readyz(context.Background())
		switch {
		case err == nil && code == http.StatusOK:
			return nil
		case err == nil:
			last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		default:
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %s", d.Tag(), timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Crashes lists the incarnations that exited without being signalled.
func (d *Daemon) Crashes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.crashes...)
}

// tail returns the last n lines of the current incarnation's log.
func (d *Daemon) tail(n int) string {
	d.mu.Lock()
	var path string
	if len(d.logs) > 0 {
		path = d.logs[len(d.logs)-1]
	}
	d.mu.Unlock()
	return tailFile(path, n)
}

// dumpLogs logs the tail of every incarnation's log.
func (d *Daemon) dumpLogs(t testing.TB, n int) {
	d.mu.Lock()
	logs := append([]string(nil), d.logs...)
	crashes := append([]string(nil), d.crashes...)
	d.mu.Unlock()
	for _, p := range logs {
		t.Logf("----- %s (last %d lines) -----\n%s", filepath.Base(p), n, tailFile(p, n))
		if dump := quitDump(p, 600); dump != "" {
			t.Logf("----- %s: goroutines at SIGQUIT -----\n%s", filepath.Base(p), dump)
		}
	}
	for _, c := range crashes {
		t.Logf("----- %s", c)
	}
}

// quitDump returns up to n lines of the goroutine dump the Go runtime wrote
// to the log at path on SIGQUIT ("" when there is none).
func quitDump(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	i := strings.Index(string(b), "SIGQUIT: quit")
	if i < 0 {
		return ""
	}
	lines := strings.Split(string(b[i:]), "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

func tailFile(path string, n int) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CountLog counts the lines containing substr in every incarnation's log.
func (d *Daemon) CountLog(substr string) int {
	d.mu.Lock()
	logs := append([]string(nil), d.logs...)
	d.mu.Unlock()
	n := 0
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n += strings.Count(string(b), substr)
	}
	return n
}

// Metric reads one sample of the ops server's /metrics: the value of the
// line that starts with series (a name with its labels, as exposed), 0
// when the series is absent.
func (d *Daemon) Metric(ctx context.Context, series string) (float64, error) {
	return d.metric(ctx, func(line string) (string, bool) { return strings.CutPrefix(line, series+" ") })
}

// MetricSum is the sum of every series of the metric name (all label
// sets), 0 when it has none.
func (d *Daemon) MetricSum(ctx context.Context, name string) (float64, error) {
	sum := 0.0
	_, err := d.metric(ctx, func(line string) (string, bool) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			return "", false
		}
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest[i+1:]), 64); err == nil {
				sum += v
			}
		}
		return "", false
	})
	return sum, err
}

// metric reads /metrics and returns the value of the first line match
// accepts.
func (d *Daemon) metric(ctx context.Context, match func(line string) (string, bool)) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.OpsURL()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := match(line); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, nil
}
