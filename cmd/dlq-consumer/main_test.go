package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The process refuses to start on a bad config and names the key.
func TestRunRejectsBadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(p, []byte("kafka:\n  topics:\n    main:\n      partitions: 0\nprocesor:\n  mailbox_size: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"--config", p})
	if err == nil || !strings.Contains(err.Error(), "procesor") {
		t.Fatalf("run = %v, want the unknown key named", err)
	}
	if err := os.WriteFile(p, []byte("kafka:\n  topics:\n    main:\n      partitions: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"--config", p})
	if err == nil || !strings.Contains(err.Error(), "kafka.topics.main.partitions must be in [1, 10000], got 0") {
		t.Fatalf("run = %v, want the bad key named", err)
	}
}

func TestRunHelp(t *testing.T) {
	if err := run(context.Background(), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h = %v", err)
	}
}
