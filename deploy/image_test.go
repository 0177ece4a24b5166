package deploy

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfpipe/kfpipe/internal/obs"
)

// imageSpec is what the Containerfile's final stage and
// scripts/image-rootfs.sh say about the image.
type imageSpec struct {
	commands []string          // in /usr/local/bin
	env      map[string]string // ENV
	user     string            // USER
	workdir  string            // WORKDIR
}

// readImageSpec reads the final stage of the Containerfile (ENV, USER,
// WORKDIR) and the commands scripts/image-rootfs.sh builds.
func readImageSpec(t *testing.T) imageSpec {
	t.Helper()
	img := imageSpec{env: map[string]string{}}
	// Join continued lines, keep the last stage.
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, "Containerfile")))
	var cur string
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		lines = append(lines, cur+l)
		cur = ""
	}
	last := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			last = i
		}
	}
	if !strings.HasPrefix(lines[last], "FROM scratch") {
		t.Fatalf("the final stage is %q, want FROM scratch", lines[last])
	}
	for _, l := range lines[last:] {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "ENV":
			for _, kv := range f[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("ENV %q: want KEY=value", kv)
				}
				img.env[k] = v
			}
		case "USER":
			img.user = f[1]
		case "WORKDIR":
			img.workdir = f[1]
		}
	}
	m := regexp.MustCompile(`(?m)^CMDS=\(([^)]*)\)`).FindSubmatch(readFile(t, "scripts", "image-rootfs.sh"))
	if m == nil {
		t.Fatal("scripts/image-rootfs.sh: no CMDS=(…)")
	}
	img.commands = strings.Fields(string(m[1]))
	return img
}

func TestImageSpec(t *testing.T) {
	img := readImageSpec(t)
	for _, d := range append(slices.Clone(daemons), "kfpipectl", "kf-loadgen") {
		if !slices.Contains(img.commands, d) {
			t.Errorf("the image does not carry %s (scripts/image-rootfs.sh CMDS %v)", d, img.commands)
		}
	}
	if uid, _, _ := strings.Cut(img.user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("USER %q: the image must run as a non-root user", img.user)
	}
	if !slices.Contains(filepath.SplitList(img.env["PATH"]), "/usr/local/bin") {
		t.Errorf("PATH %q lacks /usr/local/bin", img.env["PATH"])
	}
	if !path.IsAbs(img.env["KFPIPE_CONFIG"]) {
		t.Errorf("KFPIPE_CONFIG %q: want the absolute path the daemons read", img.env["KFPIPE_CONFIG"])
	}
}

var versionTag = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+([-+.][0-9A-Za-z.-]+)?$`)

// TestManifestsMatchImage: what the Kubernetes manifests ask of the image
// is what it has — the commands, the config where KFPIPE_CONFIG says, its
// user — and they run it locked down: a versioned tag from the overlays,
// probes with explicit timeouts above /readyz's answer bound, non-root,
// read-only root filesystem with the state on a volume, no privilege
// escalation, no capabilities, requests sized from BENCHMARKS.md.
func TestManifestsMatchImage(t *testing.T) {
	img := readImageSpec(t)
	uid, err := strconv.ParseInt(strings.Split(img.user, ":")[0], 10, 64)
	if err != nil {
		t.Fatalf("USER %q: want a numeric uid (runAsNonRoot cannot check a name)", img.user)
	}
	cfgPath := img.env["KFPIPE_CONFIG"]
	for _, dir := range []string{"base", "overlays/dev", "overlays/prod"} {
		t.Run(dir, func(t *testing.T) {
			r := build(t, repo(t, "deploy", "k8s", filepath.FromSlash(dir)))
			cfgFile := filepath.Join(t.TempDir(), "production.yaml")
			writeConfigMap(t, r, cfgFile)
			for _, w := range r.workloads {
				spec := w.template.Spec
				c := spec.Containers[0]
				daemon := filepath.Base(c.Command[0])
				t.Run(w.name, func(t *testing.T) {
					checkImageUse(t, dir, img, uid, cfgPath, spec, c, daemon)
					cfg := loadProductionConfigs(t, cfgFile, literalEnv(c))
					checkStateMounts(t, c, cfg.emergencyFile[daemon])
				})
			}
		})
	}
}

func checkImageUse(t *testing.T, dir string, img imageSpec, uid int64, cfgPath string, spec corev1.PodSpec, c corev1.Container, daemon string) {
	t.Helper()
	name, tag, _ := strings.Cut(c.Image, ":")
	if name != "kfpipe/kfpipe" {
		t.Errorf("image %q, want kfpipe/kfpipe", c.Image)
	}
	if dir != "base" && (!versionTag.MatchString(tag) || tag == "latest") {
		t.Errorf("image %q: the overlay must set a version tag (images: newTag)", c.Image)
	}
	// The entrypoint: one of the image's commands, with --config at the
	// file the image's KFPIPE_CONFIG names.
	if len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/"+daemon || !slices.Contains(img.commands, daemon) {
		t.Errorf("command %v: want [/usr/local/bin/<one of %v>]", c.Command, img.commands)
	}
	if !slices.Equal(c.Args, []string{"--config", cfgPath}) {
		t.Errorf("args %v, want [--config %s] (the image's KFPIPE_CONFIG)", c.Args, cfgPath)
	}
	var cfgMounted bool
	for _, m := range c.VolumeMounts {
		if m.MountPath == path.Dir(cfgPath) {
			for _, v := range spec.Volumes {
				cfgMounted = cfgMounted || v.Name == m.Name && v.ConfigMap != nil && m.ReadOnly
			}
		}
	}
	if !cfgMounted {
		t.Errorf("no ConfigMap mounted read-only at %s, where the image reads %s", path.Dir(cfgPath), cfgPath)
	}

	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != uid {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and runAsUser %d (the image's USER)", psc, uid)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 ||
		sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container securityContext %+v: want read-only root, no privilege escalation, capabilities drop ALL", sc)
	}

	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.TimeoutSeconds == 0 {
			t.Errorf("%s probe: timeoutSeconds must be explicit", name)
			continue
		}
		if time.Duration(p.TimeoutSeconds)*time.Second <= obs.DefaultAnswerWithin {
			t.Errorf("%s probe timeout %ds is not above /readyz's answer bound %s", name, p.TimeoutSeconds, obs.DefaultAnswerWithin)
		}
	}

	// BENCHMARKS.md: the schedule-consumer peaks at 490-675 MiB RSS with
	// processor.max_in_flight messages in flight.
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if daemon == "schedule-consumer" && req.Cmp(resource.MustParse("675Mi")) < 0 {
		t.Errorf("schedule-consumer memory request %s below its measured peak RSS (675 MiB, BENCHMARKS.md)", req)
	}
	if lim.Cmp(*req) < 0 {
		t.Errorf("memory limit %s below the request %s", lim, req)
	}
}

// checkStateMounts: with a read-only root, the DLQ emergency file must be
// on a writable volume.
func checkStateMounts(t *testing.T, c corev1.Container, emergencyFile string) {
	t.Helper()
	if emergencyFile == "" {
		return
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly && strings.HasPrefix(emergencyFile, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return
		}
	}
	t.Errorf("dlq.emergency_file %s is on no writable volume (the root filesystem is read-only)", emergencyFile)
}

func writeConfigMap(t *testing.T, r rendered, file string) {
	t.Helper()
	if len(r.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps", len(r.configMaps))
	}
	if err := writeFile(file, r.configMaps[0].Data["production.yaml"]); err != nil {
		t.Fatal(err)
	}
}

func literalEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

func writeFile(name, data string) error { return os.WriteFile(name, []byte(data), 0o600) }
