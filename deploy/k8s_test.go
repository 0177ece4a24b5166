package deploy

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kfpipe/kfpipe/internal/config"
)

// secretEnv stands in for the kfpipe-secrets Secret the operator creates.
var secretEnv = map[string]string{
	"KFPIPE_CALLBACK_TOKEN":            "test-token",
	"KFPIPE_CALLBACK_ENCODING_AES_KEY": strings.Repeat("a", 43),
	"KFPIPE_WECOM_CORP_ID":             "corp",
	"KFPIPE_WECOM_SECRET":              "secret",
}

// loaded is what the policy checks need from the three configurations.
type loaded struct {
	shutdown       map[string]time.Duration
	opsAddr        map[string]string
	mainPartitions int
	callbackAddr   string
	adminAddr      string
	emergencyFile  map[string]string // by consumer daemon
}

// loadProductionConfigs loads path for every daemon with env (plus the
// secrets) as the process environment. It uses t.Setenv: callers are not
// parallel.
func loadProductionConfigs(t *testing.T, path string, env map[string]string) loaded {
	t.Helper()
	for k, v := range secretEnv {
		t.Setenv(k, v)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var l loaded
	p, err := config.LoadProducer(path)
	if err != nil {
		t.Fatalf("kf-producer: %v", err)
	}
	c, err := config.LoadConsumer(path)
	if err != nil {
		t.Fatalf("schedule-consumer: %v", err)
	}
	d, err := config.LoadDLQConsumer(path)
	if err != nil {
		t.Fatalf("dlq-consumer: %v", err)
	}
	l.shutdown = map[string]time.Duration{"kf-producer": p.Ops.ShutdownTimeout,
		"schedule-consumer": c.Ops.ShutdownTimeout, "dlq-consumer": d.Ops.ShutdownTimeout}
	l.opsAddr = map[string]string{"kf-producer": p.Ops.Addr, "schedule-consumer": c.Ops.Addr, "dlq-consumer": d.Ops.Addr}
	l.mainPartitions = c.Kafka.Topics.Main.Partitions
	l.callbackAddr, l.adminAddr = p.Callback.Addr, d.Admin.Addr
	l.emergencyFile = map[string]string{"schedule-consumer": c.DLQ.EmergencyFile, "dlq-consumer": d.DLQ.EmergencyFile}
	return l
}

func atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// rendered is one kustomize build, decoded into the Kubernetes API types.
type rendered struct {
	workloads  []workload
	services   []corev1.Service
	configMaps []corev1.ConfigMap
	pdbs       []policyv1.PodDisruptionBudget
	hpas       []autoscalingv2.HorizontalPodAutoscaler
}

// workload is a Deployment or a StatefulSet.
type workload struct {
	kind, name string
	replicas   *int32
	selector   map[string]string
	template   corev1.PodTemplateSpec
	claims     []corev1.PersistentVolumeClaim
}

// strict decodes one object, rejecting unknown or misspelt fields, as the
// API server's strict field validation and kubeconform do.
func strict(t *testing.T, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
}

func build(t *testing.T, dir string) rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var r rendered
	for _, res := range m.Resources() {
		doc, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		switch gvk := res.GetApiVersion() + " " + res.GetKind(); gvk {
		case "apps/v1 Deployment":
			var d appsv1.Deployment
			strict(t, doc, &d)
			r.workloads = append(r.workloads, workload{kind: "Deployment", name: d.Name, replicas: d.Spec.Replicas,
				selector: d.Spec.Selector.MatchLabels, template: d.Spec.Template})
		case "apps/v1 StatefulSet":
			var s appsv1.StatefulSet
			strict(t, doc, &s)
			r.workloads = append(r.workloads, workload{kind: "StatefulSet", name: s.Name, replicas: s.Spec.Replicas,
				selector: s.Spec.Selector.MatchLabels, template: s.Spec.Template, claims: s.Spec.VolumeClaimTemplates})
			if s.Spec.ServiceName == "" {
				t.Errorf("StatefulSet %s: no serviceName", s.Name)
			}
		case "v1 Service":
			var s corev1.Service
			strict(t, doc, &s)
			r.services = append(r.services, s)
		case "v1 ConfigMap":
			var c corev1.ConfigMap
			strict(t, doc, &c)
			r.configMaps = append(r.configMaps, c)
		case "policy/v1 PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			strict(t, doc, &p)
			r.pdbs = append(r.pdbs, p)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			var h autoscalingv2.HorizontalPodAutoscaler
			strict(t, doc, &h)
			r.hpas = append(r.hpas, h)
		default:
			// Secrets in particular: they are created by the operator, only
			// referenced here, never rendered (and so never committed).
			t.Errorf("unexpected object %s %s", gvk, res.GetName())
		}
	}
	return r
}

func TestKustomizeBaseConfigIsProductionYAML(t *testing.T) {
	// kustomize may not read files outside the kustomization root, so the
	// base carries a copy; it must not drift.
	if !bytes.Equal(readFile(t, "deploy", "k8s", "base", "config.yaml"), readFile(t, "config", "production.yaml")) {
		t.Fatal("deploy/k8s/base/config.yaml differs from config/production.yaml: cp config/production.yaml deploy/k8s/base/config.yaml")
	}
}

func TestKustomizeBuilds(t *testing.T) {
	for _, dir := range []string{"base", "overlays/dev", "overlays/prod"} {
		t.Run(dir, func(t *testing.T) {
			r := build(t, repo(t, "deploy", "k8s", filepath.FromSlash(dir)))
			checkRendered(t, r)
		})
	}
}

// containerPort returns the port of the named container port.
func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func addrPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return int32(atoi(t, port))
}

func checkRendered(t *testing.T, r rendered) {
	if len(r.workloads) != 3 {
		t.Fatalf("%d workloads, want one per daemon", len(r.workloads))
	}
	if len(r.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want 1", len(r.configMaps))
	}
	cm := r.configMaps[0]
	cfgFile := filepath.Join(t.TempDir(), "production.yaml")
	if err := os.WriteFile(cfgFile, []byte(cm.Data["production.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, w := range r.workloads {
		t.Run(w.name, func(t *testing.T) {
			spec := w.template.Spec
			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers", len(spec.Containers))
			}
			c := spec.Containers[0]
			daemon := filepath.Base(c.Command[0])
			seen[daemon] = true
			if !labels.SelectorFromSet(w.selector).Matches(labels.Set(w.template.Labels)) {
				t.Errorf("selector %v does not match the pod labels %v", w.selector, w.template.Labels)
			}

			// The config the container runs: the ConfigMap file with the
			// container's literal env and the secrets.
			env := map[string]string{}
			for _, e := range c.Env {
				if e.ValueFrom != nil {
					t.Errorf("env %s: only literal values are expected here", e.Name)
				}
				env[e.Name] = e.Value
			}
			var mounted bool
			for _, m := range c.VolumeMounts {
				for _, v := range spec.Volumes {
					if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name &&
						filepath.Join(m.MountPath, "production.yaml") == c.Args[len(c.Args)-1] {
						mounted = true
					}
				}
			}
			if !mounted || c.Args[len(c.Args)-2] != "--config" {
				t.Errorf("args %v do not point --config at the mounted ConfigMap %s", c.Args, cm.Name)
			}
			var secretRef bool
			for _, ef := range c.EnvFrom {
				secretRef = secretRef || ef.SecretRef != nil && ef.SecretRef.Name == "kfpipe-secrets"
			}
			if !secretRef {
				t.Error("the secrets are not taken from the kfpipe-secrets Secret")
			}
			cfg := loadProductionConfigs(t, cfgFile, env)

			// Probes on the ops port: liveness /healthz, readiness /readyz.
			ops, ok := containerPort(c, "ops")
			if !ok || ops != addrPort(t, cfg.opsAddr[daemon]) {
				t.Errorf("ops port %d does not match ops.addr %q", ops, cfg.opsAddr[daemon])
			}
			for _, p := range []struct {
				probe *corev1.Probe
				path  string
			}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path ||
					p.probe.HTTPGet.Port.String() != "ops" {
					t.Errorf("want an HTTP probe of %s on port ops, got %+v", p.path, p.probe)
				}
			}
			switch daemon {
			case "kf-producer":
				if p, ok := containerPort(c, "callback"); !ok || p != addrPort(t, cfg.callbackAddr) {
					t.Errorf("callback port %d does not match callback.addr %q", p, cfg.callbackAddr)
				}
			case "dlq-consumer":
				if p, ok := containerPort(c, "admin"); !ok || p != addrPort(t, cfg.adminAddr) {
					t.Errorf("admin port %d does not match admin.addr %q", p, cfg.adminAddr)
				}
			case "schedule-consumer":
				// The emergency file must outlive the pod (I6).
				if w.kind != "StatefulSet" || len(w.claims) == 0 {
					t.Error("the schedule-consumer's state (DLQ emergency file) is not on a persistent volume")
				}
			}

			// Graceful shutdown finishes before the kubelet's SIGKILL.
			if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= cfg.shutdown[daemon] {
				t.Errorf("terminationGracePeriodSeconds %v must exceed ops.shutdown_timeout %s", g, cfg.shutdown[daemon])
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("resource requests not set: %v", c.Resources.Requests)
			}
			if c.Resources.Limits.Memory().IsZero() {
				t.Error("no memory limit")
			}
			if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("container must run read-only without privilege escalation")
			}

			// A disruption budget for every workload.
			var pdbs int
			for _, p := range r.pdbs {
				if labels.SelectorFromSet(p.Spec.Selector.MatchLabels).Matches(labels.Set(w.template.Labels)) {
					pdbs++
				}
			}
			if pdbs != 1 {
				t.Errorf("%d PodDisruptionBudgets select it, want 1", pdbs)
			}

			// A consumer beyond the partition count gets no partition.
			for _, h := range r.hpas {
				ref := h.Spec.ScaleTargetRef
				if ref.Kind != w.kind || ref.Name != w.name {
					continue
				}
				if int(h.Spec.MaxReplicas) > cfg.mainPartitions {
					t.Errorf("HPA maxReplicas %d > kafka.topics.main.partitions %d", h.Spec.MaxReplicas, cfg.mainPartitions)
				}
				if w.replicas != nil && (*w.replicas > h.Spec.MaxReplicas || h.Spec.MinReplicas != nil && *w.replicas < *h.Spec.MinReplicas) {
					t.Errorf("replicas %d outside the HPA's range", *w.replicas)
				}
			}
		})
	}
	for _, d := range daemons {
		if !seen[d] {
			t.Errorf("no workload runs %s", d)
		}
	}
	for _, h := range r.hpas {
		var found bool
		for _, w := range r.workloads {
			found = found || h.Spec.ScaleTargetRef.Kind == w.kind && h.Spec.ScaleTargetRef.Name == w.name
		}
		if !found {
			t.Errorf("HPA %s scales %s/%s, which is not rendered", h.Name, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
	}
	for _, s := range r.services {
		checkService(t, s, r.workloads)
	}
}

// checkService: the selector picks a workload and every named targetPort
// is one of its container ports.
func checkService(t *testing.T, s corev1.Service, ws []workload) {
	t.Helper()
	var picked []workload
	for _, w := range ws {
		if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.template.Labels)) {
			picked = append(picked, w)
		}
	}
	if len(picked) != 1 {
		t.Errorf("Service %s selects %d workloads, want 1", s.Name, len(picked))
		return
	}
	for _, p := range s.Spec.Ports {
		if _, ok := containerPort(picked[0].template.Spec.Containers[0], p.TargetPort.String()); !ok {
			t.Errorf("Service %s: targetPort %s is not a port of %s", s.Name, p.TargetPort.String(), picked[0].name)
		}
	}
}

// TestKustomizeStrictDecodingCatchesTypos makes sure the validation above
// can fail: a misspelt field in a manifest is rejected.
func TestKustomizeStrictDecodingCatchesTypos(t *testing.T) {
	doc := readFile(t, "deploy", "k8s", "base", "kf-producer.yaml")
	bad := bytes.Replace(doc, []byte("terminationGracePeriodSeconds"), []byte("terminationGracePeriodSecond"), 1)
	if bytes.Equal(bad, doc) {
		t.Fatal("fixture not found")
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(doc, &d); err != nil {
		t.Fatalf("the shipped manifest does not decode: %v", err)
	}
	err := yaml.UnmarshalStrict(bad, &d)
	if err == nil || !strings.Contains(err.Error(), "terminationGracePeriodSecond") {
		t.Fatalf("typo not reported: %v", err)
	}
}
