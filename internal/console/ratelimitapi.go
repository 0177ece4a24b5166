package console

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

func (s *base) pathUser(r *http.Request) (string, *apiError) {
	u := r.PathValue("user")
	return u, identifier("user", u, maxUserLen)
}

func (s *limits) rlStatus(w http.ResponseWriter, r *http.Request) {
	user, e := s.pathUser(r)
	if e != nil {
		writeError(w, e)
		return
	}
	st, err := s.rl.Status(r.Context(), user)
	if e := s.storeError(err, "ratelimit.status"); e != nil {
		writeError(w, e)
		return
	}
	card := RateLimitCard{RateLimitStatus: st}
	card.BlockStory, err = s.blockStory(r.Context(), st)
	if e := s.storeError(err, "ratelimit.block_story"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, card)
}

// blockedPage is the answer of GET /admin/ratelimit/blocked; next_cursor
// is "" after the last page.
type blockedPage struct {
	Users      []BlockedUser `json:"users"`
	NextCursor string        `json:"next_cursor"`
}

func (s *limits) rlBlocked(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cursor := 0
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, badRequest("cursor", "cursor must be a non-negative integer from next_cursor"))
			return
		}
		cursor = n
	}
	limit, e := queryLimit(q)
	if e != nil {
		writeError(w, e)
		return
	}
	users, next, err := s.rl.ListBlocked(r.Context(), cursor, limit)
	if e := s.storeError(err, "ratelimit.blocked"); e != nil {
		writeError(w, e)
		return
	}
	page := blockedPage{Users: users}
	if page.Users == nil {
		page.Users = []BlockedUser{}
	}
	if next > 0 {
		page.NextCursor = strconv.Itoa(next)
	}
	writeJSON(w, http.StatusOK, page)
}

// userOp is the shape of the per-user writes that take only a reason.
func (s *limits) userOp(r *http.Request, run func(r *http.Request, user string) error) (writeOp, *apiError) {
	user, reason, e := pathAndReason(r, "user", maxUserLen)
	if e != nil {
		return writeOp{}, e
	}
	return writeOp{target: "user:" + user, reason: reason, do: func(r *http.Request) (any, error) {
		return okResponse{OK: true}, run(r, user)
	}}, nil
}

// unblockAnswer is POST /admin/ratelimit/unblock/{user}'s answer: the
// user's dead letters that still wait for their scheduled retry, which
// the scheduler placed after the block's old end (or later, paced): an
// unblock does not bring them forward. WaitingUntil is the latest of their
// retry times; a batch retry of the user's letters sends them now.
type unblockAnswer struct {
	OK             bool       `json:"ok"`
	WaitingLetters int        `json:"waiting_letters"`
	WaitingUntil   *time.Time `json:"waiting_until,omitempty"`
	// Retry is the request that retries them now, when there are any.
	Retry string `json:"retry,omitempty"`
}

func (s *limits) rlUnblock(r *http.Request) (writeOp, *apiError) {
	user, reason, e := pathAndReason(r, "user", maxUserLen)
	if e != nil {
		return writeOp{}, e
	}
	return writeOp{target: "user:" + user, reason: reason, do: func(r *http.Request) (any, error) {
		ctx := r.Context()
		if err := s.rl.Unblock(ctx, user); err != nil {
			return nil, err
		}
		ans := unblockAnswer{OK: true}
		// The letters a retry of the user would act on now (not done, not
		// settled, not due already): those wait for their scheduled time.
		ls, err := s.dlq.Select(ctx, DLQFilter{User: user, Limit: maxBatchLimit}, &RetryOptions{DryRun: true})
		if err != nil {
			// The unblock happened; the count is a courtesy.
			s.log.Warn("unblock: the user's waiting letters not counted", zap.String("user_id", user), zap.Error(err))
			return ans, nil
		}
		var ids []string
		for _, l := range ls {
			if l.Skip == "" {
				ans.WaitingLetters++
				ids = append(ids, l.ID)
			}
		}
		if ans.WaitingLetters == 0 {
			return ans, nil
		}
		for _, id := range ids[:min(len(ids), 50)] {
			if m, err := s.dlq.Get(ctx, id); err == nil && m.NextRetryTime != nil && (ans.WaitingUntil == nil || m.NextRetryTime.After(*ans.WaitingUntil)) {
				t := *m.NextRetryTime
				ans.WaitingUntil = &t
			}
		}
		ans.Retry = `POST /admin/dlq/batch-retry {"filter":{"user":"` + user + `"},"reason":"…"} (kfpipectl dlq retry --user ` + user + `)`
		return ans, nil
	}}, nil
}

func (s *limits) rlWhitelistAdd(r *http.Request) (writeOp, *apiError) {
	return s.userOp(r, func(r *http.Request, u string) error { return s.rl.Whitelist(r.Context(), u) })
}

func (s *limits) rlWhitelistRemove(r *http.Request) (writeOp, *apiError) {
	return s.userOp(r, func(r *http.Request, u string) error { return s.rl.RemoveWhitelist(r.Context(), u) })
}

type groupBody struct {
	Group  string `json:"group"`
	Reason string `json:"reason"`
}

func (s *limits) rlSetGroup(r *http.Request) (writeOp, *apiError) {
	user, e := s.pathUser(r)
	if e != nil {
		return writeOp{}, e
	}
	var b groupBody
	reason, e := decodeWithReason(r, &b, &b.Reason)
	if e != nil {
		return writeOp{}, e
	}
	switch {
	case b.Group == "":
		return writeOp{}, unprocessable("group", "group is required")
	case len(s.cfg.Groups) > 0 && !slices.Contains(s.cfg.Groups, b.Group):
		return writeOp{}, unprocessable("group", "unknown group: must be one of "+strings.Join(s.cfg.Groups, ", "))
	case len(b.Group) > maxFilterLen:
		return writeOp{}, unprocessable("group", "unknown group")
	}
	return writeOp{target: "user:" + user + " group=" + b.Group, reason: reason, do: func(r *http.Request) (any, error) {
		return okResponse{OK: true}, s.rl.SetGroup(r.Context(), user, b.Group)
	}}, nil
}

// blockBody's duration is a Go duration ("90m", "24h"); empty or "0"
// blocks permanently.
type blockBody struct {
	Reason   string `json:"reason"`
	Duration string `json:"duration"`
}

// blockResponse says what block was set.
type blockResponse struct {
	OK        bool   `json:"ok"`
	Permanent bool   `json:"permanent"`
	Duration  string `json:"duration,omitempty"`
}

func (s *limits) rlBlock(r *http.Request) (writeOp, *apiError) {
	user, e := s.pathUser(r)
	if e != nil {
		return writeOp{}, e
	}
	var b blockBody
	reason, e := decodeWithReason(r, &b, &b.Reason)
	if e != nil {
		return writeOp{}, e
	}
	var d time.Duration
	if b.Duration != "" && b.Duration != "0" {
		var err error
		d, err = time.ParseDuration(b.Duration)
		if err != nil {
			return writeOp{}, unprocessable("duration", `duration must be a duration such as "2h" or "90m" (empty: permanent)`)
		}
		if d < time.Second || d > maxBlockPeriod {
			return writeOp{}, unprocessable("duration", fmt.Sprintf("duration must be in [1s, %s] (empty: permanent)", maxBlockPeriod))
		}
	}
	target := "user:" + user + " permanent"
	resp := blockResponse{OK: true, Permanent: d == 0}
	if d > 0 {
		target = "user:" + user + " for=" + d.String()
		resp.Duration = d.String()
	}
	return writeOp{target: target, reason: reason, do: func(r *http.Request) (any, error) {
		return resp, s.rl.Block(r.Context(), user, d)
	}}, nil
}

func itoa(n int) string { return strconv.Itoa(n) }

func (s *limits) rlRules(w http.ResponseWriter, r *http.Request) {
	rules, err := s.rl.Rules(r.Context())
	if e := s.storeError(err, "ratelimit.rules"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, rules)
}

// rulesBody is PUT /admin/ratelimit/rules: the whole group map and the
// version it was read at.
type rulesBody struct {
	Reason  string              `json:"reason"`
	Version *int64              `json:"version"`
	Groups  map[string]RateRule `json:"groups"`
}

// rulesAnswer is a successful rules change.
type rulesAnswer struct {
	Version int64 `json:"version"`
}

func (s *limits) rlSetRules(r *http.Request) (writeOp, *apiError) {
	var b rulesBody
	reason, e := decodeWithReason(r, &b, &b.Reason)
	if e != nil {
		return writeOp{}, e
	}
	switch {
	case b.Version == nil:
		return writeOp{}, unprocessable("version", "version is required: the version GET /admin/ratelimit/rules returned")
	case *b.Version < 0:
		return writeOp{}, unprocessable("version", "version must be >= 0")
	case len(b.Groups) == 0:
		return writeOp{}, unprocessable("groups", "groups is required: the whole group map")
	}
	return writeOp{target: "ratelimit:rules@" + strconv.FormatInt(*b.Version, 10), reason: reason, do: func(r *http.Request) (any, error) {
		v, err := s.rl.SetRules(r.Context(), b.Groups, *b.Version)
		return rulesAnswer{Version: v}, err
	}}, nil
}
