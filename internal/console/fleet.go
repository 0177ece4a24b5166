package console

import (
	"net/http"
	"time"

	"github.com/kfpipe/kfpipe/internal/fleet"
)

// FleetList is GET /admin/fleet's answer: the daemons registered in etcd,
// live ones counted by role; one whose lease expired is listed stale (with
// when it was last heard from) until fleet.Judge says it is gone, and not
// counted, as in kfpipectl health and the overview's consumers table.
type FleetList struct {
	Members []fleet.Member `json:"members"`
	ByRole  map[string]int `json:"by_role"`
	// Changed is when the list last changed (a join, an update or a leave).
	Changed *time.Time `json:"changed,omitempty"`
}

func (s *watch) fleetList(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Fleet == nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable,
			Msg: "the fleet is kept in etcd: set coord.enabled: true (and coord.endpoints) on every daemon"})
		return
	}
	ms, changed := s.cfg.Fleet.Members()
	out := FleetList{Members: ms, ByRole: map[string]int{}}
	for _, m := range ms {
		if !m.Stale {
			out.ByRole[m.Role]++
		}
	}
	if !changed.IsZero() {
		out.Changed = &changed
	}
	writeJSON(w, http.StatusOK, out)
}
