package console

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type openAPIDoc struct {
	OpenAPI string                                `yaml:"openapi"`
	Paths   map[string]map[string]openAPOperation `yaml:"paths"`
}

type openAPOperation struct {
	OperationID string         `yaml:"operationId"`
	Responses   map[string]any `yaml:"responses"`
}

// TestOpenAPIMatchesRoutes keeps docs/openapi.yaml and the mux in step:
// every registered route is documented and every documented operation is
// registered, each with the auth answers it can give.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	srv, err := New(Config{Tokens: testTokens(), MaxBodyBytes: 4096}, newMemDLQ(t0), newMemRL(t0), nopRedis(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	routes := srv.Routes()
	for _, r := range routes {
		method, path, _ := strings.Cut(r, " ")
		op, ok := doc.Paths[path][strings.ToLower(method)]
		if !ok {
			t.Errorf("route %s is not in docs/openapi.yaml", r)
			continue
		}
		want := []string{"200", "401"}
		if method != "GET" {
			want = append(want, "403", "422")
		}
		for _, code := range want {
			if _, ok := op.Responses[code]; !ok {
				t.Errorf("%s: response %s not documented", r, code)
			}
		}
	}
	ids := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			r := strings.ToUpper(method) + " " + path
			if !slices.Contains(routes, r) {
				t.Errorf("docs/openapi.yaml documents %s, which is not registered", r)
			}
			if op.OperationID == "" || ids[op.OperationID] {
				t.Errorf("%s: operationId %q missing or repeated", r, op.OperationID)
			}
			ids[op.OperationID] = true
		}
	}
}
