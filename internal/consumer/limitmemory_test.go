package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
)

// fakeMemory is a LimitMemory in a map.
type fakeMemory struct {
	mu    sync.Mutex
	saved map[string]int
	err   error
}

func (m *fakeMemory) LoadLimit(_ context.Context, name string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.saved[name], m.err
}

func (m *fakeMemory) SaveLimit(_ context.Context, name string, n int, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saved[name] = n
	return m.err
}

// TestRecallStartsAtTheSavedLimit: a consumer started in a group whose
// members saved a handler limit starts at it (capped by max_in_flight),
// not at overload.initial_limit; a lower saved limit, or a memory that
// fails, leaves initial_limit; and its saver ends with the consumer's run.
func TestRecallStartsAtTheSavedLimit(t *testing.T) {
	cfg := config.Consumer{Overload: config.Overload{MaxInFlight: 64, InitialLimit: 10, Tolerance: 1.3}}
	for _, tc := range []struct {
		name  string
		saved int
		err   error
		want  int
	}{
		{"saved above initial", 27, nil, 27},
		{"saved above max_in_flight", 500, nil, 64},
		{"saved below initial", 4, nil, 10},
		{"nothing saved", 0, nil, 10},
		{"memory unreachable", 27, errors.New("redis down"), 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDownstream(cfg, time.Now, nil)
			mem := &fakeMemory{saved: map[string]int{"g": tc.saved}, err: tc.err}
			ctx, cancel := context.WithCancel(context.Background())
			d.recall(ctx, mem, "g", zap.NewNop())
			if got := d.limit.Stats().Limit; got != tc.want {
				t.Fatalf("limit %d, want %d", got, tc.want)
			}
			cancel()
			d.stopRemembering() // returns: the saver ended with ctx
		})
	}
	// No memory, or no limit (max_in_flight 0): nothing to do.
	d := newDownstream(cfg, time.Now, nil)
	d.recall(context.Background(), nil, "g", zap.NewNop())
	d.stopRemembering()
	off := newDownstream(config.Consumer{Overload: config.Overload{MaxInFlight: 0}}, time.Now, nil)
	off.recall(context.Background(), &fakeMemory{saved: map[string]int{"g": 27}}, "g", zap.NewNop())
	off.stopRemembering()
}
