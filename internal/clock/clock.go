// Package clock is kfpipe's one time source. Everything whose behaviour
// depends on time (limiter windows, breaker timeouts, snowflake rollback,
// backoff, retry schedules) takes a Clock, or one of the Clocks below that
// can also wait, so tests run exact and fast on a clock they move by hand
// (testenv.Clock). Each package names the one it needs as its own Clock
// (an alias: ratelimit.Clock is clock.Clock, consumer.Clock is
// clock.TimerClock), so a clock made for one package fits every other that
// needs no more.
package clock

import "time"

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// SleepClock is a Clock that waits by sleeping; a fake one advances its
// own time in Sleep (idgen's generator).
type SleepClock interface {
	Clock
	Sleep(d time.Duration)
}

// AfterClock is a Clock that hands out timer channels (the producer's
// backoff and safety sync).
type AfterClock interface {
	Clock
	After(d time.Duration) <-chan time.Time
}

// TimerClock is a Clock that runs a function after a while, in its own
// goroutine (the consumer's retries, commits and batch waits).
type TimerClock interface {
	Clock
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable, resettable timer from TimerClock.AfterFunc.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// System is the wall clock, with every method above.
var System system

type system struct{}

func (system) Now() time.Time                            { return time.Now() }
func (system) Sleep(d time.Duration)                     { time.Sleep(d) }
func (system) After(d time.Duration) <-chan time.Time    { return time.After(d) }
func (system) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var (
	_ SleepClock = System
	_ AfterClock = System
	_ TimerClock = System
)
