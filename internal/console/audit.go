package console

// The audit stream (I8): its one writer (audit: every write route, once),
// its one reader (scanAudit: GET /admin/audit, a block story's operator
// actions, a timeline's), and the route that pages through it.

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// auditEntry is one write as the audit stream records it (I8: who, what,
// why, when, and how it ended).
type auditEntry struct {
	Who    string
	Action string
	Target string
	Reason string
	Result string
}

// audit appends e to <prefix>audit and logs it. The write already happened,
// so a failing XADD does not turn the answer into an error (the operator
// would retry a done write); the log line carries the same fields and a
// metric counts the miss.
func (s *base) audit(ctx context.Context, e auditEntry) {
	now := s.clock.Now().UTC().Format(time.RFC3339Nano)
	fields := []zap.Field{zap.String("who", e.Who), zap.String("action", e.Action), zap.String("target", e.Target),
		zap.String("reason", e.Reason), zap.String("time", now), zap.String("result", e.Result)}
	// A client that hangs up must not cancel its own audit entry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	err := s.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: s.cfg.Prefix + "audit",
		MaxLen: s.cfg.AuditMaxLen,
		Approx: true,
		Values: []string{"who", e.Who, "action", e.Action, "target", e.Target, "reason", e.Reason,
			"time", now, "result", e.Result},
	}).Err()
	if err != nil {
		s.m.auditFailures.Inc()
		s.log.Error("admin audit not written to redis", append(fields, zap.Error(err))...)
		return
	}
	s.log.Info("admin audit", fields...)
}

// scanAudit is the one reader of the audit stream: it calls f with its
// entries newest first, from below top ("+": from the newest), reading
// pages of page entries and at most max entries in all; f returns false
// to stop. next is the ID of the last entry read when entries older than
// it remain unread ("" when the stream's start was reached): a page's
// cursor, or a sign that the search was cut at max.
func (s *base) scanAudit(ctx context.Context, top string, max, page int, f func(AuditEntry) bool) (next string, err error) {
	for scanned := 0; scanned < max; {
		msgs, err := s.rdb.XRevRangeN(ctx, s.cfg.Prefix+"audit", top, "-", int64(page)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", err
		}
		for _, m := range msgs {
			scanned++
			next = m.ID
			str := func(k string) string { v, _ := m.Values[k].(string); return v }
			if !f(AuditEntry{ID: m.ID, Who: str("who"), Action: str("action"), Target: str("target"),
				Reason: str("reason"), Time: str("time"), Result: str("result")}) {
				return next, nil
			}
		}
		if len(msgs) < page {
			return "", nil
		}
		top = "(" + next
	}
	return next, nil
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
	next, err := s.scanAudit(r.Context(), top, auditScan, limit, func(e AuditEntry) bool {
		if match(e) {
			page.Entries = append(page.Entries, e)
		}
		return len(page.Entries) < limit
	})
	if e := s.storeError(err, "audit.list"); e != nil {
		writeError(w, e)
		return
	}
	page.NextCursor = next
	writeJSON(w, http.StatusOK, page)
}
