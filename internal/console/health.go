package console

import (
	"fmt"
	"net/http"
	"time"
)

// maxBlockedCount caps how many blocked users GET /admin/health counts:
// past it the answer says "at least".
const maxBlockedCount = 10000

// healthResponse is the answer of GET /admin/health: the overview an
// on-call engineer reads first.
type healthResponse struct {
	// Status is "ok", or "attention" when Attention lists something an
	// operator should look at.
	Status    string    `json:"status"`
	Attention []string  `json:"attention"`
	Time      time.Time `json:"time"`
	DLQ       DLQStats  `json:"dlq"`
	// ReviewBacklog is the number of dead letters waiting for manual review.
	ReviewBacklog int64 `json:"review_backlog"`
	// BlockedUsers counts the users blocked now, up to 10000;
	// BlockedUsersCapped says the count stopped there.
	BlockedUsers       int  `json:"blocked_users"`
	BlockedUsersCapped bool `json:"blocked_users_capped"`
}

func (s *watch) health(w http.ResponseWriter, r *http.Request) {
	st, err := s.dlq.Stats(r.Context())
	if e := s.storeError(err, "health.dlq"); e != nil {
		writeError(w, e)
		return
	}
	if st.ByReason == nil {
		st.ByReason = map[string]int64{}
	}
	h := healthResponse{Status: "ok", Attention: []string{}, Time: s.clock.Now().UTC(), DLQ: st, ReviewBacklog: st.Review}
	h.BlockedUsers, h.BlockedUsersCapped, err = s.countBlocked(r)
	if e := s.storeError(err, "health.blocked"); e != nil {
		writeError(w, e)
		return
	}
	if st.Review > 0 {
		h.Attention = append(h.Attention, fmt.Sprintf("%d dead letter(s) wait for manual review", st.Review))
	}
	if st.DueNow > 0 {
		h.Attention = append(h.Attention, fmt.Sprintf("%d dead letter(s) are due for a retry now", st.DueNow))
	}
	if len(h.Attention) > 0 {
		h.Status = "attention"
	}
	writeJSON(w, http.StatusOK, h)
}

// countBlocked counts the users blocked now, up to maxBlockedCount
// (capped then says there are more).
func (s *watch) countBlocked(r *http.Request) (n int, capped bool, err error) {
	for cursor := 0; ; {
		users, next, err := s.rl.ListBlocked(r.Context(), cursor, maxPageLimit)
		if err != nil {
			return 0, false, err
		}
		n += len(users)
		if n >= maxBlockedCount {
			return maxBlockedCount, next > 0 || n > maxBlockedCount, nil
		}
		if next <= 0 {
			return n, false, nil
		}
		cursor = next
	}
}
