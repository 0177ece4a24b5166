package fleet

import "time"

// A daemon reports itself twice: a schedule-consumer writes its status
// (actors, breakers) to Redis every 10 s for the console's consumers table
// and `kfpipectl health`, and every daemon keeps its registry entry alive
// in etcd for `kfpipectl fleet`. Both are judged by one rule, Judge, so the
// three views agree: a daemon not heard from for StaleAfter is shown stale
// (and not counted in totals), and after GoneAfter it is not shown at all —
// a killed process does not haunt the fleet for the hour its old status
// key may live on.
const (
	// StaleAfter is three missed status reports (every 10 s).
	StaleAfter = 30 * time.Second
	// GoneAfter bounds how long a silent daemon stays on view: long enough
	// for an operator to notice the stale entry, short enough that the
	// fleet half an hour after a kill is the fleet that runs.
	GoneAfter = 5 * time.Minute
)

// Presence is how a daemon is shown.
type Presence int

const (
	// Live: heard from within StaleAfter.
	Live Presence = iota
	// Stale: silent for StaleAfter (stopped, killed, or cut off); shown
	// flagged, not counted.
	Stale
	// Gone: silent for GoneAfter; no longer shown.
	Gone
)

func (p Presence) String() string {
	switch p {
	case Live:
		return "live"
	case Stale:
		return "stale"
	}
	return "gone"
}

// Judge says how a daemon last heard from at heard is shown at now.
func Judge(heard, now time.Time) Presence {
	switch silent := now.Sub(heard); {
	case silent > GoneAfter:
		return Gone
	case silent > StaleAfter:
		return Stale
	}
	return Live
}
