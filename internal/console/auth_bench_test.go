package console

import (
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe/internal/config"
)

// BenchmarkAuthLookup measures the constant-time token check over 10
// configured tokens (hash + compare against each).
func BenchmarkAuthLookup(b *testing.B) {
	var toks []config.AdminToken
	for i := range 10 {
		toks = append(toks, config.AdminToken{Name: fmt.Sprint("t", i), Token: fmt.Sprintf("token-%02d-0123456789abcdef", i), Role: RoleViewer})
	}
	a := newAuthenticator(toks)
	for b.Loop() {
		if a.lookup("token-09-0123456789abcdef") != 9 {
			b.Fatal("no match")
		}
	}
}
