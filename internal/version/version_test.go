package version

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

func TestRequested(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--config", "x.yaml"}, false},
		{[]string{"--version"}, true},
		{[]string{"--config", "x.yaml", "-version"}, true},
		{[]string{"--", "--version"}, false},
	} {
		if got := Requested(c.args); got != c.want {
			t.Errorf("Requested(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

func TestHandlePrintsEveryField(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3", "0123456789abcdef", "2026-01-02T03:04:05Z"
	var b bytes.Buffer
	if Handle(&b, "kf-producer", []string{"--config", "x"}, nil) || b.Len() != 0 {
		t.Fatalf("no --version, but printed %q", b.String())
	}
	if !Handle(&b, "kf-producer", []string{"--version"}, func() string { return "2.11.1" }) {
		t.Fatal("--version not handled")
	}
	for _, want := range []string{"kf-producer v1.2.3", "0123456789abcdef", "2026-01-02T03:04:05Z", runtime.Version(), "librdkafka: 2.11.1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("--version output %q lacks %q", b.String(), want)
		}
	}
	if s := Get("2.11.1").String(); s != "v1.2.3 (commit 0123456789ab, built 2026-01-02T03:04:05Z, "+runtime.Version()+", librdkafka 2.11.1)" {
		t.Errorf("String() = %q", s)
	}
}

func TestDefaultsWhenNotSet(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "", "", ""
	i := Get("")
	if i.Version == "" || i.Commit == "" || i.Date == "" {
		t.Fatalf("empty fields: %+v", i)
	}
	var b bytes.Buffer
	i.Write(&b, "kfpipectl")
	if !strings.Contains(b.String(), "librdkafka: not linked") {
		t.Fatalf("%q", b.String())
	}
}
