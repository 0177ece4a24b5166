package kfpipe_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/kf"
)

// TestBatchConsumerRuns runs a batch consumer on the real broker and Redis
// against the fake WeChat: a customer's five messages, sent at once, reach
// the batch handler in order in batches of at most 3, and each batch is
// answered once. The first run is stopped while its first batch's reply
// is sent and the batch is not finished (a crash between the reply and the
// done marks); the second run is handed the same messages again, replies
// under the same key, and WeChat gets no second reply.
func TestBatchConsumerRuns(t *testing.T) {
	const kfID = "wk-batch"
	e := newE2E(t, kfID)
	fake := e.fake
	words := []string{"my", "order", "1234", "has", "not arrived"}
	for _, w := range words {
		fake.AddText(kfID, "u1", w)
	}
	e.produce(t)

	cfg := e.config(t)
	cfg.Kafka.Consumer.RevokeDrainLimit = time.Second
	cfg.Ops.ShutdownTimeout = time.Second + config.StopReserve

	if _, err := kfpipe.NewBatchConsumer(cfg, kfpipe.BatchHandlerFunc(nil), 1, 0); err == nil || !strings.Contains(err.Error(), "size") {
		t.Fatalf("a batch size of 1: %v, want an error naming size", err)
	}

	var mu sync.Mutex
	var batches [][]string // the texts of each batch handed over, per run
	var run int
	firstBatchSent := make(chan struct{})
	bh := kfpipe.BatchHandlerFunc(func(ctx context.Context, msgs []*kfpipe.Message) error {
		var texts []string
		for _, m := range msgs {
			text, _ := m.Text()
			texts = append(texts, text)
		}
		mu.Lock()
		batches = append(batches, texts)
		r, n := run, len(batches)
		mu.Unlock()
		if err := kfpipe.Reply(ctx, kf.Text{Content: "Got: " + strings.Join(texts, " ")}); err != nil {
			return err
		}
		if r == 1 && n == 1 {
			// The crash: the reply is sent, the batch never finishes.
			close(firstBatchSent)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	runOnce := func(r int, until func() error) {
		t.Helper()
		mu.Lock()
		run, batches = r, nil
		mu.Unlock()
		c, err := kfpipe.NewBatchConsumer(cfg, bh, 3, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		testenv.Eventually(t, 60*time.Second, func() error {
			select {
			case err := <-done:
				t.Fatalf("run %d: Run returned early: %v", r, err)
			default:
			}
			if err := until(); err != nil {
				return fmt.Errorf("run %d: %w", r, err)
			}
			return nil
		})
		cancel()
		select {
		case <-done: // run 1 ends with its handler cut short
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return 30 s after its context ended")
		}
	}

	runOnce(1, func() error {
		select {
		case <-firstBatchSent:
			return nil
		default:
			return errors.New("the first batch's reply not sent yet")
		}
	})
	mu.Lock()
	first := slices.Clone(batches[0])
	mu.Unlock()
	if len(fake.Replies(kfID, "u1")) != 1 {
		t.Fatalf("replies after the first run: %+v", fake.Replies(kfID, "u1"))
	}

	handled := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, b := range batches {
			n += len(b)
		}
		return n
	}
	runOnce(2, func() error {
		n := handled()
		return testenv.Check(n >= len(words), "%d messages handed over in batches, want %d", n, len(words))
	})
	time.Sleep(300 * time.Millisecond) // a late extra batch or reply would show
	mu.Lock()
	defer mu.Unlock()
	var flat []string
	for _, b := range batches {
		if len(b) > 3 {
			t.Fatalf("a batch of %d messages (at most 3): %q", len(b), batches)
		}
		flat = append(flat, b...)
	}
	if !slices.Equal(flat, words) {
		t.Fatalf("the second run's batches %q: want every message once, in order: %q", batches, words)
	}
	if !slices.Equal(batches[0], first) {
		t.Fatalf("the re-run's first batch %q, the crashed run's %q", batches[0], first)
	}
	rs := fake.Replies(kfID, "u1")
	if len(rs) != len(batches) {
		t.Fatalf("%d replies for %d batches (the crashed batch must not be answered twice): %+v", len(rs), len(batches), rs)
	}
	for i, b := range batches {
		if want := "Got: " + strings.Join(b, " "); !strings.Contains(string(rs[i].Body), want) {
			t.Fatalf("reply %d %s, want %q", i, rs[i].Body, want)
		}
	}
}

// TestNewBatchConsumerChecks: bad arguments are clear errors, before
// anything connects.
func TestNewBatchConsumerChecks(t *testing.T) {
	cfg, err := kfpipe.LoadConfig(filepath.Join(testenv.RepoRoot(t), "config", "test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bh := kfpipe.BatchHandlerFunc(func(context.Context, []*kfpipe.Message) error { return nil })
	for _, tt := range []struct {
		name string
		make func() (*kfpipe.Consumer, error)
		want string
	}{
		{"no config", func() (*kfpipe.Consumer, error) { return kfpipe.NewBatchConsumer(nil, bh, 3, 0) }, "configuration"},
		{"no handler", func() (*kfpipe.Consumer, error) { return kfpipe.NewBatchConsumer(cfg, nil, 3, 0) }, "batch handler"},
		{"size 1", func() (*kfpipe.Consumer, error) { return kfpipe.NewBatchConsumer(cfg, bh, 1, 0) }, "size"},
		{"size above the mailbox", func() (*kfpipe.Consumer, error) {
			return kfpipe.NewBatchConsumer(cfg, bh, cfg.Processor.MailboxSize+1, 0)
		}, "processor.mailbox_size"},
		{"negative wait", func() (*kfpipe.Consumer, error) { return kfpipe.NewBatchConsumer(cfg, bh, 3, -time.Second) }, "wait"},
		{"middleware", func() (*kfpipe.Consumer, error) {
			return kfpipe.NewBatchConsumer(cfg, bh, 3, 0, kfpipe.WithMiddleware(kfpipe.Timeout(time.Second)))
		}, "WithMiddleware"},
	} {
		if _, err := tt.make(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming %q", tt.name, err, tt.want)
		}
	}
	if _, err := kfpipe.NewBatchConsumer(cfg, bh, 3, time.Second); err != nil {
		t.Fatalf("good arguments: %v", err)
	}
}
