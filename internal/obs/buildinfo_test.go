package obs

import (
	"testing"

	"github.com/kfpipe/kfpipe/internal/version"
)

// TestBuildInfoLabels: kfpipe_build_info names the daemon and the build.
func TestBuildInfoLabels(t *testing.T) {
	i := version.Info{Version: "v1.2.3", Commit: "abc", Date: "2026-01-02T03:04:05Z", Go: "go1.26", Librdkafka: "2.11.1"}
	mfs, err := NewRegistryLabels("kf-producer", BuildLabels(i)).Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"daemon": "kf-producer", "version": "v1.2.3", "commit": "abc",
		"build_date": "2026-01-02T03:04:05Z", "go_version": "go1.26", "librdkafka_version": "2.11.1"}
	for _, mf := range mfs {
		if mf.GetName() != "kfpipe_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("label %s = %q, want %q", k, got[k], v)
			}
		}
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("value %v", m.GetGauge().GetValue())
		}
		return
	}
	t.Fatal("no kfpipe_build_info")
}
