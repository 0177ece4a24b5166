package coord

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigValidateNamesKeys(t *testing.T) {
	dir := t.TempDir()
	pem := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(pem, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func() Config { return Config{Endpoints: []string{"http://127.0.0.1:2379", "10.0.0.1:2379"}} }
	tests := []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error; none: valid
	}{
		{"defaults", func(*Config) {}, nil},
		{"no endpoints", func(c *Config) { c.Endpoints = nil }, []string{"coord.endpoints must not be empty"}},
		{"bad endpoint", func(c *Config) { c.Endpoints = []string{"ok:1", "ftp://x:1", "nohost"} },
			[]string{"coord.endpoints[1]", "coord.endpoints[2]"}},
		{"dial timeout", func(c *Config) { c.DialTimeout = -time.Second }, []string{"coord.dial_timeout must be in"}},
		{"dial timeout too long", func(c *Config) { c.DialTimeout = time.Hour }, []string{"coord.dial_timeout"}},
		{"keep alive", func(c *Config) { c.KeepAlive = 500 * time.Millisecond }, []string{"coord.keep_alive must be in"}},
		{"namespace", func(c *Config) { c.Namespace = "/kfpipe" }, []string{"coord.namespace must end in"}},
		{"password alone", func(c *Config) { c.Password = "p" }, []string{"coord.username must be set"}},
		{"username alone", func(c *Config) { c.Username = "u" }, []string{"coord.password must be set"}},
		{"cert without key", func(c *Config) { c.TLS.CertFile = pem }, []string{"coord.tls.key_file must be set"}},
		{"key without cert", func(c *Config) { c.TLS.KeyFile = pem }, []string{"coord.tls.cert_file must be set"}},
		{"missing files", func(c *Config) {
			c.TLS = TLSConfig{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: pem, CAFile: dir}
		}, []string{"coord.tls.cert_file", "coord.tls.ca_file", "is a directory"}},
		{"all at once", func(c *Config) { c.Endpoints = nil; c.KeepAlive = -1 },
			[]string{"coord.endpoints", "coord.keep_alive"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}

// New refuses an invalid config before connecting, and fails within the
// dial timeout when etcd does not answer instead of returning a Provider
// that fails later.
func TestNewChecksConfigAndConnection(t *testing.T) {
	if _, err := New(context.Background(), Config{}); err == nil || !strings.Contains(err.Error(), "coord.endpoints") {
		t.Fatalf("New with no endpoints: %v", err)
	}
	ln := closedPort(t)
	start := time.Now()
	_, err := New(context.Background(), Config{Endpoints: []string{ln}, DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "reach etcd") {
		t.Fatalf("New on a closed port: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("New took %s to fail", d)
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
