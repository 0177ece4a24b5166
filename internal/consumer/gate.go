package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/config"
)

// gate is the node's downstream health gate. A user's failing handler is
// that user's problem: its messages are retried and then dead-lettered
// (and its breaker opens). When the handler fails for many users at once,
// the downstream is down for everyone, and dead-lettering the whole
// stream would only move it into the DLQ (and Redis). Then the gate opens:
//
//   - no handler is called except a few probes (outage.probes at a time,
//     one every outage.probe_interval); every other message waits where
//     it is, in its user's order, holding its claim;
//   - a message that has used its processor.retry_attempts is not
//     dead-lettered while the gate is open: it waits and is retried;
//   - the partitions' in-flight cap (processor.max_in_flight) then pauses
//     reading, so the backlog stays in Kafka, not in memory or Redis;
//   - the first success — a probe's, or any handler's — closes it, and
//     everything waiting goes on at once.
//
// It opens when, among the handler's last calls (2×outage.min_users, at
// least 20, none older than outage.window), failures are at least
// outage.failure_ratio and come from at least outage.min_users users
// not judged (see judged: users failing while others are served):
// a count of calls, not of seconds, so it sees an outage after a few
// dozen calls at any traffic. Permanent failures (the handler
// refused the message) do not count. The decision is per node: each consumer sees its own
// partitions' users (docs/operations.md, "Downstream outages").
type gate struct {
	cfg   config.Outage
	clock Clock
	log   *zap.Logger
	m     gateMetrics

	mu        sync.Mutex
	open      bool
	openedAt  time.Time
	calls     []gateCall // the last calls' outcomes, a ring
	next      int        // where the next call goes in calls
	probing   int
	nextProbe time.Time
	closedCh  chan struct{} // closed when the gate closes; a new one when it opens
	held      int
	lastFail  time.Time // the last retryable failure's time
	// judged are failing users whose failures are their own, not an
	// outage's: a suspicion already waited a whole outage.window for them
	// without the gate opening (heldInVain), or the downstream served
	// other users while they failed (a success that was not a probe while
	// the gate was open). They no longer make the gate suspect or open it.
	// A user leaves it with its first success or once it has not failed
	// for outage.window; the value is its last failure. At most the users
	// failing within one window.
	judged map[string]time.Time
}

type gateCall struct {
	user string
	at   time.Time
	ok   bool
}

type gateMetrics struct {
	open        prometheus.Gauge
	transitions *prometheus.CounterVec
	probes      *prometheus.CounterVec
	held        prometheus.Gauge
}

// newGate returns the gate, or nil (never opens) with outage.min_users 0.
func newGate(cfg config.Outage, clock Clock, log *zap.Logger, reg prometheus.Registerer) *gate {
	if cfg.MinUsers == 0 {
		return nil
	}
	g := &gate{cfg: cfg, clock: clock, log: log, calls: make([]gateCall, max(2*cfg.MinUsers, 20)),
		closedCh: make(chan struct{}), judged: map[string]time.Time{}}
	close(g.closedCh)
	g.m = gateMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kfpipe_outage_gate_open",
			Help: "1 while the downstream health gate is open: the handler fails for many users, messages wait instead of being dead-lettered."}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kfpipe_outage_gate_transitions_total",
			Help: "Openings and closings of the downstream health gate."}, []string{"to"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kfpipe_outage_probes_total",
			Help: "Handler calls let through the open gate, by result."}, []string{"result"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kfpipe_outage_held_messages",
			Help: "Messages waiting at the open gate (one per user at most)."}),
	}
	for _, r := range []string{"ok", "failed"} {
		g.m.probes.WithLabelValues(r)
	}
	for _, to := range []string{"open", "closed"} {
		g.m.transitions.WithLabelValues(to)
	}
	if reg != nil {
		reg.MustRegister(g.m.open, g.m.transitions, g.m.probes, g.m.held)
	}
	return g
}

// isOpen reports whether the gate is open.
func (g *gate) isOpen() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// hold returns at once while the gate is closed. While it is open it
// waits until the caller may call the handler as a probe (probe true) or
// the gate closes; ok is false when ctx ended first.
func (g *gate) hold(ctx context.Context) (probe, ok bool) {
	if g == nil {
		return false, true
	}
	counted := false
	defer func() {
		if counted {
			g.mu.Lock()
			g.held--
			g.m.held.Set(float64(g.held))
			g.mu.Unlock()
		}
	}()
	for {
		g.mu.Lock()
		if !g.open {
			g.mu.Unlock()
			return false, true
		}
		now := g.clock.Now()
		if g.probing < g.cfg.Probes && !now.Before(g.nextProbe) {
			g.probing++
			g.nextProbe = now.Add(g.cfg.ProbeInterval)
			g.mu.Unlock()
			return true, true
		}
		if !counted {
			counted = true
			g.held++
			g.m.held.Set(float64(g.held))
		}
		closed, wait := g.closedCh, max(g.nextProbe.Sub(now), time.Millisecond)
		g.mu.Unlock()
		t := make(chan struct{})
		timer := g.clock.AfterFunc(wait, func() { close(t) })
		select {
		case <-closed:
		case <-t:
		case <-ctx.Done():
			timer.Stop()
			return false, false
		}
		timer.Stop()
	}
}

// result records a handler call's outcome: ok, or a retryable failure of
// user's message. probe says whether hold let it through as a probe;
// called is when the call started.
func (g *gate) result(user string, ok, probe bool, called time.Time) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	if probe {
		g.probing--
		if ok {
			g.m.probes.WithLabelValues("ok").Inc()
		} else {
			g.m.probes.WithLabelValues("failed").Inc()
		}
	}
	g.calls[g.next] = gateCall{user: user, at: now, ok: ok}
	g.next = (g.next + 1) % len(g.calls)
	if ok {
		delete(g.judged, user)
		if g.open {
			// The downstream answered while these users failed: whether
			// it is back (a probe, after an outage) or never was down
			// (a served user's call; many users' accounts broken
			// downstream among many that work), their failures from now
			// on are their own. They no longer count toward the gate, so
			// their messages go on to the DLQ after their attempts
			// instead of everyone waiting on them (chaos
			// recovery-after-fix: 200 failing users among 1,300 served
			// kept the gate opening and closing, a hundred times a
			// minute). After an outage they succeed now and leave judged.
			n := g.judgeFailing(now, now)
			why := fmt.Sprintf("a handler call succeeded (probe=%t); the recent failures of %d users are taken as theirs", probe, n)
			g.setOpen(false, now, why)
		} else if g.lastFail.After(now.Add(-g.cfg.Window)) {
			// The same while the gate is closed (and may be suspect):
			// the downstream served a call that started after these
			// users' failures, so they are not an outage's. Only such a
			// call: one that started before an outage may still succeed
			// after its first failures. Without this a failing user back
			// after a quiet window was fresh again, and one fresh user
			// kept the gate suspect for everyone: each message out of
			// attempts waited a whole outage.window for a verdict
			// (chaos recovery-after-fix, phase 2: 200 failing users
			// among 1,300 served got one letter every 30 s each).
			g.judgeFailing(called.Add(-time.Nanosecond), now) // strictly before it
			delete(g.judged, user)
		}
		return
	}
	g.lastFail = now
	if last, ok := g.judged[user]; ok {
		if now.Sub(last) > g.cfg.Window {
			delete(g.judged, user) // quiet for a window: judged anew
		} else {
			g.judged[user] = now
		}
	}
	if g.open {
		return
	}
	users, calls, failed, fresh := g.recent(now)
	if fresh >= g.cfg.MinUsers && float64(failed) >= g.cfg.FailureRatio*float64(calls) {
		g.setOpen(true, now, fmt.Sprintf("%d of the last %d calls failed, for %d users", failed, calls, users))
	}
}

// judgeFailing marks the users with a failure among the recent calls
// (within outage.window of now), at or before until, as judged and
// returns how many there are. Called with g.mu held.
func (g *gate) judgeFailing(until, now time.Time) int {
	from, n := now.Add(-g.cfg.Window), 0
	for _, c := range g.calls {
		if !c.at.IsZero() && !c.ok && !c.at.Before(from) && !c.at.After(until) {
			// Judged as of its newest failure (or a later verdict,
			// heldInVain's): an older one would end the verdict early.
			if last, ok := g.judged[c.user]; !ok {
				n++
				g.judged[c.user] = c.at
			} else if c.at.After(last) {
				g.judged[c.user] = c.at
			}
		}
	}
	return n
}

// suspect reports whether the gate may be about to open: recent calls of
// more than one user failing, at least half of them, and at least one of
// those users not judged yet. A message out of attempts then waits (up to
// outage.window) instead of being dead-lettered at once, so the first
// messages of an outage do not go to the DLQ while the gate counts users.
// A suspicion that waited a whole window without the gate opening is
// spent (heldInVain): a few users whose downstream is broken, with little
// other traffic, otherwise held one message each per window forever.
func (g *gate) suspect() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	users, calls, failed, fresh := g.recent(g.clock.Now())
	return users >= 2 && 2*failed >= calls && fresh > 0
}

// heldInVain records that a message of user waited outage.window while
// the gate was suspect and it did not open: user and the users failing now
// are judged, and only a user failing besides them makes the gate suspect
// again. user's own failures are a window old by now (it called nothing
// while it waited), so it is judged as of now: its next failure, right
// after, finds it judged. Before, it was judged only if it had failed
// within the window — never, after a whole window's wait — and every
// message of a user failing among many waited a window (chaos
// recovery-after-fix, phase 2: one letter every 30 s a user).
func (g *gate) heldInVain(user string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	g.judgeFailing(now, now)
	g.judged[user] = now
}

// recent counts, among the last calls (at most outage.window old), the
// calls, the failed ones, the distinct users that failed and how many of
// those are not judged; judged users that have not failed for a window
// are forgotten.
func (g *gate) recent(now time.Time) (users, calls, failed, fresh int) {
	from := now.Add(-g.cfg.Window)
	seen := make(map[string]bool, len(g.calls))
	for _, c := range g.calls {
		if c.at.IsZero() || c.at.Before(from) {
			continue
		}
		calls++
		if !c.ok {
			failed++
			if !seen[c.user] {
				seen[c.user] = true
				users++
				if _, ok := g.judged[c.user]; !ok {
					fresh++
				}
			}
		}
	}
	for u, last := range g.judged {
		if last.Before(from) {
			delete(g.judged, u)
		}
	}
	return users, calls, failed, fresh
}

// release gives back a probe slot whose call said nothing of the
// downstream (cut short by a stop or a lost claim).
func (g *gate) release(probe bool) {
	if g == nil || !probe {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing--
}

func (g *gate) setOpen(open bool, now time.Time, why string) {
	g.open = open
	if open {
		g.openedAt, g.closedCh, g.nextProbe = now, make(chan struct{}), now.Add(g.cfg.ProbeInterval)
		g.m.open.Set(1)
		g.m.transitions.WithLabelValues("open").Inc()
		g.log.Warn("downstream gate open: the handler fails for many users; messages wait instead of being dead-lettered",
			zap.String("why", why), zap.Duration("probe_interval", g.cfg.ProbeInterval))
		return
	}
	close(g.closedCh)
	clear(g.calls)
	g.m.open.Set(0)
	g.m.transitions.WithLabelValues("closed").Inc()
	g.log.Info("downstream gate closed", zap.String("why", why), zap.Duration("was_open", now.Sub(g.openedAt)))
}

// Detail is the gate's line for /readyz ("" when closed).
func (g *gate) detail() string {
	if g == nil {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		return ""
	}
	return fmt.Sprintf("downstream gate open for %s: %d messages waiting, probing every %s",
		g.clock.Now().Sub(g.openedAt).Round(time.Second), g.held, g.cfg.ProbeInterval)
}
