package console

import (
	"bytes"
	"embed"
	"html"
	"io/fs"
	"net/http"

	"github.com/kfpipe/kfpipe/internal/version"
)

//go:embed ui
var uiFiles embed.FS

// uiHandler serves the console. The files are static and hold no data, so
// they need no token; the strict CSP keeps them from loading anything but
// themselves, and the API answers only to the bearer token.
func uiHandler() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embed directive guarantees the directory
	}
	files := http.StripPrefix("/admin/ui/", http.FileServer(http.FS(sub)))
	// The footer names the build: {{build}} in index.html.
	index, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		panic(err)
	}
	index = bytes.ReplaceAll(index, []byte("{{build}}"), []byte(html.EscapeString(version.Get("").String())))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/admin/ui/" || r.URL.Path == "/admin/ui/index.html" {
			h.Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(index)
			return
		}
		files.ServeHTTP(w, r)
	})
}
