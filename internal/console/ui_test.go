package console

import (
	"html"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/version"
)

// TestConsoleFooterNamesTheBuild: the console's footer shows the build
// (internal/version), not the template's placeholder.
func TestConsoleFooterNamesTheBuild(t *testing.T) {
	f := newFixture(t)
	r := f.do(t, "", "GET", "/admin/ui/", "")
	body := string(r.body)
	if r.status != 200 || strings.Contains(body, "{{build}}") ||
		!strings.Contains(body, `<footer id="build">kfpipe `+html.EscapeString(version.Get("").String())+"</footer>") {
		t.Fatalf("status %d, footer missing or not filled in: %s", r.status, body[strings.LastIndex(body, "</main>"):])
	}
}
