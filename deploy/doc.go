// Package deploy holds no code: it is the home of the deployment files
// (systemd units, Kubernetes manifests, Prometheus rules, the Grafana
// dashboard) and of the tests that keep them working against the code —
// systemd-analyze on the units, kustomize builds validated against the
// Kubernetes API types, promtool on the rules, and a check that every metric
// an alert or panel uses is one the daemons export.
package deploy
