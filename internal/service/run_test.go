package service

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each daemon refuses to start on a bad config and names the key.
func TestRunRejectsBadConfig(t *testing.T) {
	runs := map[string]func(context.Context, []string) error{
		"kf-producer": RunProducer, "schedule-consumer": RunConsumer, "dlq-consumer": RunDLQ}
	for name, run := range runs {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.yaml")
			write := func(body string) {
				if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write("kafka:\n  topics:\n    main:\n      partitions: 0\nprocesor:\n  mailbox_size: 3\n")
			if err := run(context.Background(), []string{"--config", p}); err == nil || !strings.Contains(err.Error(), "procesor") {
				t.Fatalf("run = %v, want the unknown key named", err)
			}
			write("kafka:\n  topics:\n    main:\n      partitions: 0\n")
			err := run(context.Background(), []string{"--config", p})
			if err == nil || !strings.Contains(err.Error(), "kafka.topics.main.partitions must be in [1, 10000], got 0") {
				t.Fatalf("run = %v, want the bad key named", err)
			}
			if err := run(context.Background(), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("run -h = %v", err)
			}
		})
	}
}
