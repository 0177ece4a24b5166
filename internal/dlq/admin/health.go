package admin

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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

// AuditEntry is one entry of the audit stream as GET /admin/audit shows it.
type AuditEntry struct {
	ID     string `json:"id"`
	Who    string `json:"who"`
	Action string `json:"action"`
	Target string `json:"target"`
	Reason string `json:"reason"`
	Time   string `json:"time"`
	Result string `json:"result"`
}

// auditPage is the answer of GET /admin/audit, newest first; next_cursor is
// "" after the last page.
type auditPage struct {
	Entries    []AuditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor"`
}

var streamID = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// auditScan is how many audit entries one filtered page reads at most.
const auditScan = 10000

func (s *base) auditList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, e := queryLimit(q)
	if e != nil {
		writeError(w, e)
		return
	}
	top := "+"
	if c := q.Get("cursor"); c != "" {
		if !streamID.MatchString(c) {
			writeError(w, badRequest("cursor", "cursor must be the next_cursor of the previous page"))
			return
		}
		top = "(" + c // exclusive: the page after the cursor's entry
	}
	who, action, target := q.Get("who"), q.Get("action"), q.Get("target")
	for k, v := range map[string]string{"who": who, "action": action, "target": target} {
		if len(v) > maxFilterLen {
			writeError(w, badRequest(k, k+" too long"))
			return
		}
	}
	match := func(e AuditEntry) bool {
		return (who == "" || e.Who == who) && (action == "" || e.Action == action || strings.HasPrefix(e.Action, action+".")) &&
			(target == "" || strings.Contains(e.Target, target))
	}
	// Filtered pages scan at most auditScan entries each; the cursor then
	// says where to go on, so a rare match costs several pages, not one
	// unbounded scan.
	page := auditPage{Entries: make([]AuditEntry, 0, limit)}
	for scanned := 0; scanned < auditScan && len(page.Entries) < limit; {
		msgs, err := s.rdb.XRevRangeN(r.Context(), s.cfg.Prefix+"audit", top, "-", int64(limit)).Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		if e := s.storeError(err, "audit.list"); e != nil {
			writeError(w, e)
			return
		}
		page.NextCursor = ""
		for _, m := range msgs {
			str := func(k string) string { v, _ := m.Values[k].(string); return v }
			e := AuditEntry{ID: m.ID, Who: str("who"), Action: str("action"),
				Target: str("target"), Reason: str("reason"), Time: str("time"), Result: str("result")}
			scanned++
			page.NextCursor = m.ID
			if match(e) {
				page.Entries = append(page.Entries, e)
				if len(page.Entries) == limit {
					break
				}
			}
		}
		if len(msgs) < limit {
			page.NextCursor = "" // the stream's start
			break
		}
		top = "(" + page.NextCursor
	}
	writeJSON(w, http.StatusOK, page)
}
