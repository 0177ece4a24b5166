// Package version says which build a binary is: the module version, the
// commit and the build date (set with -ldflags -X by make image and make
// package, read from the Go build info otherwise), and the Go and
// librdkafka versions it was built with.
package version

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
)

// Set at build time:
//
//	-ldflags "-X github.com/kfpipe/kfpipe/internal/version.version=v1.2.3
//	          -X github.com/kfpipe/kfpipe/internal/version.commit=abc1234
//	          -X github.com/kfpipe/kfpipe/internal/version.date=2026-01-02T03:04:05Z"
var version, commit, date string

// Info is one binary's build.
type Info struct {
	Version    string // git describe or the module version; "dev" when unknown
	Commit     string // "unknown" when unknown
	Date       string // RFC 3339, "unknown" when unknown
	Go         string
	Librdkafka string // "" when the binary does not link librdkafka
}

// Get returns this binary's build; librdkafka is the linked librdkafka's
// version, or "" when the binary does not link it.
func Get(librdkafka string) Info {
	i := Info{Version: version, Commit: commit, Date: date, Go: runtime.Version(), Librdkafka: librdkafka}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && i.Commit == "":
				i.Commit = s.Value
			case s.Key == "vcs.time" && i.Date == "":
				i.Date = s.Value
			}
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	if i.Date == "" {
		i.Date = "unknown"
	}
	return i
}

// String is the build on one line, as the console's footer shows it.
func (i Info) String() string {
	s := fmt.Sprintf("%s (commit %s, built %s, %s", i.Version, short(i.Commit), i.Date, i.Go)
	if i.Librdkafka != "" {
		s += ", librdkafka " + i.Librdkafka
	}
	return s + ")"
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// Write prints what `name --version` prints.
func (i Info) Write(w io.Writer, name string) {
	fmt.Fprintf(w, "%s %s\ncommit:     %s\nbuilt:      %s\ngo:         %s\n", name, i.Version, i.Commit, i.Date, i.Go)
	if i.Librdkafka != "" {
		fmt.Fprintf(w, "librdkafka: %s\n", i.Librdkafka)
	} else {
		fmt.Fprintf(w, "librdkafka: not linked\n")
	}
}

// Requested reports whether args (without the program name) ask for the
// version: --version or -version anywhere before a "--".
func Requested(args []string) bool {
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	return slices.Contains(args, "--version") || slices.Contains(args, "-version")
}

// Handle prints the version to w and returns true when args ask for it;
// librdkafka (nil for a binary without it) returns the linked version.
// A main calls it first: if version.Handle(...) { return }.
func Handle(w io.Writer, name string, args []string, librdkafka func() string) bool {
	if !Requested(args) {
		return false
	}
	var rd string
	if librdkafka != nil {
		rd = librdkafka()
	}
	Get(rd).Write(w, name)
	return true
}
