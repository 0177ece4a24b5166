package testenv

import (
	"sync"
	"time"
)

// Clock is a clock tests move by hand, safe for concurrent use. It
// satisfies every package's Now-only Clock, idgen's Now/Sleep one and the
// Now/After ones: Sleep advances the time instead of waiting (and records
// the sleep), After fires when the clock is moved past its deadline, so
// waiting code is checked to the nanosecond without waiting. It
// deliberately has no UnixNano method (idgen would read that fast path
// instead of Now).
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	sleeps  []time.Duration
	waiters []waiter
}

// waiter is a pending After.
type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a Clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (backwards too: clock-rollback tests).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	c.fireLocked()
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// Sleep advances the clock by d at once and records d for Slept.
func (c *Clock) Sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	c.fireLocked()
}

// Slept returns the total slept since the last call and resets the record.
func (c *Clock) Slept() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum time.Duration
	for _, d := range c.sleeps {
		sum += d
	}
	c.sleeps = nil
	return sum
}

// After returns a channel that receives the clock's time once the clock has
// been moved to now+d or later (at once when d <= 0).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	// One slot: the time is sent once and never blocks the mover.
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	c.fireLocked()
	return ch
}

// Waiters returns how many After channels have not fired yet, so a test can
// wait until the code under test is waiting before it moves the clock.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// fireLocked sends to the waiters that are due.
func (c *Clock) fireLocked() {
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}
