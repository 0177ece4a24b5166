package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// failingExport yields n messages, then fails.
type failingExport struct {
	*memDLQ
	n int
}

func (d failingExport) Export(_ context.Context, _ DLQFilter, fn func(DLQMessage) error) error {
	for i := range d.n {
		if err := fn(DLQMessage{ID: "x" + itoa(i), User: "u", Reason: "rate_limited", FailureTime: t0}); err != nil {
			return err
		}
	}
	return errStoreDown
}

// TestExportFailureMidStreamIsVisible: once rows are out the status cannot
// change, so the connection is cut and the client sees an incomplete
// transfer instead of a file that looks complete.
func TestExportFailureMidStreamIsVisible(t *testing.T) {
	srv, err := New(Config{Tokens: testTokens(), MaxBodyBytes: 4096}, failingExport{newMemDLQ(t0), 250}, newMemRL(t0), nopRedis(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(t, srv)
	req, _ := http.NewRequest("GET", hs.URL+"/admin/dlq/export?format=json", nil)
	req.Header.Set("Authorization", vw)
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read error = %v after %d lines, want an unexpected EOF", err, strings.Count(string(body), "\n"))
	}
	if n := strings.Count(string(body), "\n"); n < exportFlushEvery {
		t.Errorf("%d lines arrived before the cut, want at least the %d flushed", n, exportFlushEvery)
	}
}
