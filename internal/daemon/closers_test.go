package daemon

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClosersReverseOrderJoinedErrors: parts close last added first, each
// with the shutdown's context; every part closes even after one fails or
// the deadline passed; the errors come back joined and named; a second
// Close does nothing.
func TestClosersReverseOrderJoinedErrors(t *testing.T) {
	var c Closers
	var order []string
	boom := errors.New("boom")
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c.AddFunc("redis", func() error { order = append(order, "redis"); return nil })
	c.Add("ops", func(got context.Context) error {
		order = append(order, "ops")
		if _, ok := got.Deadline(); !ok {
			return errors.New("no deadline")
		}
		return boom
	})
	c.Add("consumer", func(context.Context) error {
		order = append(order, "consumer")
		cancel() // a slow part used up the deadline: the rest still close
		return context.DeadlineExceeded
	})
	err := c.Close(ctx)
	if want := []string{"consumer", "ops", "redis"}; !slices.Equal(order, want) {
		t.Fatalf("closed %v, want %v", order, want)
	}
	if !errors.Is(err, boom) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "close ops: boom") || !strings.Contains(err.Error(), "close consumer: ") {
		t.Fatalf("Close = %v, want both errors, named", err)
	}
	if err := c.Close(ctx); err != nil || len(order) != 3 {
		t.Fatalf("second Close: %v, closed %v", err, order)
	}
	var empty Closers
	if err := empty.Close(ctx); err != nil {
		t.Fatalf("empty Close = %v", err)
	}
}

// TestExitCode: Main's verdict on a command's error.
func TestExitCode(t *testing.T) {
	live := context.Background()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want int
		out  string
	}{
		{"success", live, nil, 0, ""},
		{"failure", live, errors.New("redis down"), 1, "kf-producer: redis down\n"},
		{"help", live, fmt.Errorf("parse: %w", flag.ErrHelp), 0, ""},
		{"stopped by a signal while starting", stopped, fmt.Errorf("start: %w", context.Canceled), 0, ""},
		{"failed after a signal", stopped, errors.New("flush: kafka"), 1, "kf-producer: flush: kafka\n"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		if got := exitCode(tt.ctx, "kf-producer", tt.err, &out); got != tt.want || out.String() != tt.out {
			t.Errorf("%s: exit %d, stderr %q; want %d, %q", tt.name, got, out.String(), tt.want, tt.out)
		}
	}
}
