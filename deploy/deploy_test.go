package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// daemons are the three commands, by the name of their cmd/ directory.
var daemons = []string{"kf-producer", "schedule-consumer", "dlq-consumer"}

func repo(t testing.TB, parts ...string) string {
	return filepath.Join(append([]string{testenv.RepoRoot(t)}, parts...)...)
}

func readFile(t testing.TB, parts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(repo(t, parts...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// buildDaemons builds the three commands into dir.
func buildDaemons(t *testing.T, dir string) {
	t.Helper()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, d := range daemons {
		args = append(args, "./cmd/"+d)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = testenv.RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

var execStart = regexp.MustCompile(`(?m)^ExecStart=/usr/local/bin/([a-z-]+)( .*)?$`)

// verifyUnits copies the units into a temp dir with ExecStart pointing at
// binDir and returns what systemd-analyze verify prints about them.
func verifyUnits(t *testing.T, tool, binDir string, edit func(name, unit string) string) string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for _, d := range daemons {
		name := "kfpipe-" + d + ".service"
		unit := string(readFile(t, "deploy", "systemd", name))
		m := execStart.FindStringSubmatch(unit)
		if m == nil || m[1] != d {
			t.Fatalf("%s: ExecStart does not run /usr/local/bin/%s", name, d)
		}
		unit = execStart.ReplaceAllString(unit, "ExecStart="+filepath.Join(binDir, d)+"$2")
		if edit != nil {
			unit = edit(name, unit)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	cmd := exec.Command(tool, append([]string{"verify", "--man=no"}, paths...)...)
	out, _ := cmd.CombinedOutput()
	// Keep only what concerns our units: verify also loads the units they
	// reference (network-online.target…), whose problems are the host's.
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "kfpipe") || strings.Contains(line, dir) || strings.Contains(line, binDir) {
			ours = append(ours, line)
		}
	}
	return strings.Join(ours, "\n")
}

func TestSystemdUnitsVerify(t *testing.T) {
	t.Parallel()
	tool := testenv.Tool(t, "systemd-analyze")
	bin := t.TempDir()
	buildDaemons(t, bin)

	if out := verifyUnits(t, tool, bin, nil); out != "" {
		t.Errorf("systemd-analyze verify:\n%s", out)
	}
	// The check must be able to fail: a misspelt directive and a missing
	// binary are both reported.
	out := verifyUnits(t, tool, bin, func(name, unit string) string {
		if name == "kfpipe-kf-producer.service" {
			return strings.Replace(unit, "NoNewPrivileges=", "NoNewPrivilege=", 1)
		}
		return unit
	})
	if !strings.Contains(out, "NoNewPrivilege") {
		t.Errorf("a misspelt directive was not reported: %q", out)
	}
	if out := verifyUnits(t, tool, filepath.Join(bin, "missing"), nil); out == "" {
		t.Error("a missing ExecStart binary was not reported")
	}
}

// TestSystemdUnitsPolicy checks what systemd-analyze cannot: the stop
// timeout leaves room for the graceful shutdown, and the daemons that keep
// an emergency file have their own.
func TestSystemdUnitsPolicy(t *testing.T) {
	cfg := loadProductionConfigs(t, repo(t, "config", "production.yaml"), nil)
	files := map[string]bool{}
	for _, d := range daemons {
		unit := string(readFile(t, "deploy", "systemd", "kfpipe-"+d+".service"))
		stop := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)$`).FindStringSubmatch(unit)
		if stop == nil {
			t.Fatalf("%s: no TimeoutStopSec", d)
		}
		if got, limit := atoi(t, stop[1]), int(cfg.shutdown[d].Seconds()); got <= limit {
			t.Errorf("%s: TimeoutStopSec=%d must exceed ops.shutdown_timeout (%ds)", d, got, limit)
		}
		for _, want := range []string{"User=kfpipe", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"} {
			if !strings.Contains(unit, want) {
				t.Errorf("%s: missing %q", d, strings.TrimSpace(want))
			}
		}
		if d == "kf-producer" {
			continue
		}
		m := regexp.MustCompile(`(?m)^Environment=KFPIPE_DLQ_EMERGENCY_FILE=(/var/lib/kfpipe/[^/]+)/\S+$`).FindStringSubmatch(unit)
		if m == nil {
			t.Errorf("%s: no per-daemon KFPIPE_DLQ_EMERGENCY_FILE under /var/lib/kfpipe/<dir>/", d)
			continue
		}
		if files[m[1]] {
			t.Errorf("%s shares its emergency-file directory %s with another daemon", d, m[1])
		}
		files[m[1]] = true
		if !strings.Contains(unit, "StateDirectory="+strings.TrimPrefix(m[1], "/var/lib/")+"\n") {
			t.Errorf("%s: StateDirectory does not create %s (ProtectSystem=strict makes everything else read-only)", d, m[1])
		}
	}
}
