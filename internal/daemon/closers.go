package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Closers is what a daemon built and must release, closed in the reverse
// order it was added (what was built last, on what was built before it,
// goes first). Add each part as soon as it is built: a failure later in
// the start-up then closes exactly what exists (Close), and the daemon's
// own Close is the same call. The zero value is ready to use; it is safe
// for concurrent use.
type Closers struct {
	mu sync.Mutex
	cs []namedCloser
}

type namedCloser struct {
	name  string
	close func(context.Context) error
}

// Add adds a part whose Close takes the shutdown's context (it should
// give up at its deadline).
func (c *Closers) Add(name string, close func(context.Context) error) {
	c.mu.Lock()
	c.cs = append(c.cs, namedCloser{name: name, close: close})
	c.mu.Unlock()
}

// AddFunc adds a part whose Close takes no context (a client's Close).
func (c *Closers) AddFunc(name string, close func() error) {
	c.Add(name, func(context.Context) error { return close() })
}

// Close closes every part, last added first, each with ctx — the parts
// after a deadline passed are still closed (they must release what they
// hold), and may then fail fast — and returns their errors joined, each
// named ("close redis: …"). The parts are forgotten: a second Close does
// nothing.
func (c *Closers) Close(ctx context.Context) error {
	c.mu.Lock()
	cs := c.cs
	c.cs = nil
	c.mu.Unlock()
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i].close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", cs[i].name, err))
		}
	}
	return errors.Join(errs...)
}
