package console

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

func (s *letters) dlqStats(w http.ResponseWriter, r *http.Request) {
	st, err := s.dlq.Stats(r.Context())
	if e := s.storeError(err, "dlq.stats"); e != nil {
		writeError(w, e)
		return
	}
	if st.ByReason == nil {
		st.ByReason = map[string]int64{}
	}
	writeJSON(w, http.StatusOK, st)
}

// messagePage is the answer of GET /admin/dlq/messages.
type messagePage struct {
	Messages   []DLQMessage `json:"messages"`
	NextCursor string       `json:"next_cursor"`
}

func (s *letters) dlqList(w http.ResponseWriter, r *http.Request) {
	f, e := s.queryFilter(r.URL.Query(), true)
	if e != nil {
		writeError(w, e)
		return
	}
	msgs, next, err := s.dlq.List(r.Context(), f)
	if e := s.storeError(err, "dlq.list"); e != nil {
		writeError(w, e)
		return
	}
	if msgs == nil {
		msgs = []DLQMessage{}
	}
	writeJSON(w, http.StatusOK, messagePage{Messages: msgs, NextCursor: next})
}

func (s *letters) dlqGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if e := identifier("id", id, maxIDLen); e != nil {
		writeError(w, e)
		return
	}
	m, err := s.dlq.Get(r.Context(), id)
	if e := s.storeError(err, "dlq.get"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// reasonBody is the body of the writes that need nothing but a reason.
type reasonBody struct {
	Reason string `json:"reason"`
}

// okResponse answers writes that return nothing else.
type okResponse struct {
	OK bool `json:"ok"`
}

// pathAndReason reads a write's path value name (an identifier of at
// most maxLen bytes) and the operator's reason (body {"reason": …} or
// ?reason=).
func pathAndReason(r *http.Request, name string, maxLen int) (value, reason string, e *apiError) {
	value = r.PathValue(name)
	if e := identifier(name, value, maxLen); e != nil {
		return "", "", e
	}
	var b reasonBody
	reason, e = decodeWithReason(r, &b, &b.Reason)
	return value, reason, e
}

// retryBody is the body of POST /admin/dlq/retry/{id}: the operator's
// reason, dry_run (decide only: the answer, 200 or 409, is the one the
// real call would give) and include_invalid (retry a letter whose reason
// is never retried, invalid_message or handler_rejected; audited).
type retryBody struct {
	Reason         string `json:"reason"`
	DryRun         bool   `json:"dry_run"`
	IncludeInvalid bool   `json:"include_invalid"`
}

// retryAnswer answers a single retry.
type retryAnswer struct {
	OK     bool `json:"ok"`
	DryRun bool `json:"dry_run,omitempty"`
}

func (s *letters) dlqRetry(r *http.Request) (writeOp, *apiError) {
	id := r.PathValue("id")
	if e := identifier("id", id, maxIDLen); e != nil {
		return writeOp{}, e
	}
	var b retryBody
	reason, e := decodeWithReason(r, &b, &b.Reason)
	if e != nil {
		return writeOp{}, e
	}
	target := "dlq:" + id
	if b.IncludeInvalid {
		target += " include_invalid"
	}
	o := RetryOptions{DryRun: b.DryRun, IncludeInvalid: b.IncludeInvalid}
	return writeOp{target: target, reason: reason, dryRun: b.DryRun, do: func(r *http.Request) (any, error) {
		if err := s.dlq.Retry(r.Context(), id, o); err != nil {
			return nil, err
		}
		return retryAnswer{OK: true, DryRun: b.DryRun}, nil
	}}, nil
}

// batchBody is the body of batch-retry and purge. The filter's "reason" is
// the failure reason; the top-level "reason" is why the operator acts.
// DryRun answers the count the write would act on, acting on nothing.
type batchBody struct {
	Filter *batchFilter `json:"filter"`
	Reason string       `json:"reason"`
	DryRun bool         `json:"dry_run"`
	// IncludeInvalid (retry only) retries letters whose reason is never
	// retried (invalid_message, handler_rejected) as well.
	IncludeInvalid bool `json:"include_invalid"`
	// Unblock (retry only, with filter.user) unblocks the user in the
	// rate limiter, then retries the user's letters: one audited action.
	Unblock bool `json:"unblock"`
}

type batchFilter struct {
	User   string `json:"user"`
	Reason string `json:"reason"`
	Review *bool  `json:"review"`
	Limit  int    `json:"limit"`
	// All must be set to act on every message: an empty filter is more
	// often a mistake than an intent.
	All bool `json:"all"`
}

// BatchPlan answers a batch write (kfpipectl reads it): what it selected and, unless it was a
// dry run, the batch that now acts on it (GET /admin/dlq/batches/{id}).
// A dry run and the real call decide with the same function (the
// DLQStore's Select): the real call acts on exactly the letters its dry
// run counted in Count, unless they changed in between.
type BatchPlan struct {
	DryRun bool   `json:"dry_run,omitempty"`
	Action string `json:"action"`
	// Count is how many letters the batch acts on: for a retry the
	// selected ones but those it skips (below). A message has one
	// letter, so it is also the number of messages.
	Count int `json:"count"`
	// Messages is how many messages Count's letters are.
	Messages int `json:"messages"`
	// Selected is how many letters the filter matched.
	Selected int `json:"selected"`
	// AlreadyDone letters' messages are done in the dedup store: a retry
	// skips them.
	AlreadyDone int `json:"already_done"`
	// NotRetryable letters have a reason that is never retried
	// (invalid_message, handler_rejected): skipped unless include_invalid.
	NotRetryable int `json:"not_retryable"`
	// Settled letters were retried already (or are done): never again
	// until their message fails again.
	Settled int `json:"settled"`
	// Busy letters are due now or being re-injected: they go anyway.
	Busy int `json:"busy"`
	// Users is how many users Count's letters belong to.
	Users    int         `json:"users"`
	TopUsers []UserCount `json:"top_users"`
	// Blocked are the users of Count's letters the rate limiter blocks
	// now: their letters would be refused again (user_blocked) unless
	// they are unblocked first (unblock).
	Blocked []BlockedUser `json:"blocked,omitempty"`
	// Unblocked is the user unblocked before the retry (unblock).
	Unblocked      string `json:"unblocked,omitempty"`
	IncludeInvalid bool   `json:"include_invalid,omitempty"`
	Rate           int    `json:"rate"`
	// Seconds is how long until the last letter is back in the main
	// topic: the batch's own time at Rate or, for a retry, the slowest
	// user's time at the scheduler's per-user pace, whichever is longer.
	Seconds float64 `json:"seconds"`
	// RateSeconds is the batch's own time at Rate.
	RateSeconds float64 `json:"rate_seconds"`
	// Pace is the per-user pacing a retry's letters go back at (absent
	// when retries are not paced, and for a purge).
	Pace  *RetryPacing `json:"pace,omitempty"`
	Batch *Batch       `json:"batch,omitempty"`
}

func (s *letters) batchOp(r *http.Request, action string) (writeOp, *apiError) {
	var b batchBody
	reason, e := decodeWithReason(r, &b, &b.Reason)
	if e != nil {
		return writeOp{}, e
	}
	if b.Filter == nil {
		return writeOp{}, unprocessable("filter", `filter is required, e.g. {"filter": {"user": "u1"}}; {"filter": {"all": true}} selects everything`)
	}
	bf := *b.Filter
	f := DLQFilter{User: bf.User, Reason: bf.Reason, Review: bf.Review, Limit: bf.Limit}
	if e := s.checkFilter(f, http.StatusUnprocessableEntity); e != nil {
		e.Field = "filter." + e.Field
		return writeOp{}, e
	}
	if bf.Limit < 0 || bf.Limit > maxBatchLimit {
		return writeOp{}, unprocessable("filter.limit", "filter.limit must be in [0, 100000] (0: no limit)")
	}
	empty := f.User == "" && f.Reason == "" && f.Review == nil
	if empty && !bf.All {
		return writeOp{}, unprocessable("filter", "empty filter selects every message: set filter.all to true if that is meant")
	}
	if !empty && bf.All {
		return writeOp{}, unprocessable("filter.all", "filter.all cannot be combined with user, reason or review")
	}
	if action != ActionRetry && (b.IncludeInvalid || b.Unblock) {
		return writeOp{}, unprocessable("include_invalid", "include_invalid and unblock apply to a retry only")
	}
	if b.Unblock && f.User == "" {
		return writeOp{}, unprocessable("unblock", "unblock needs filter.user: it unblocks that user, then retries the user's letters")
	}
	target := filterTarget(f)
	if b.IncludeInvalid {
		target += " include_invalid"
	}
	if b.Unblock {
		target += " unblock"
	}
	if f.Limit == 0 {
		f.Limit = maxBatchLimit
	}
	id := ""
	if !b.DryRun {
		id = s.batches.newID()
	}
	started := false
	audited := func() string {
		if started {
			return target + " batch=" + id
		}
		return target
	}
	var retry *RetryOptions
	if action == ActionRetry {
		retry = &RetryOptions{DryRun: true, IncludeInvalid: b.IncludeInvalid, Batch: id}
	}
	return writeOp{target: target, reason: reason, dryRun: b.DryRun, audited: audited, do: func(r *http.Request) (any, error) {
		ctx := r.Context()
		plan := BatchPlan{DryRun: b.DryRun, Action: action, Rate: s.cfg.BatchRate, IncludeInvalid: b.IncludeInvalid}
		if b.Unblock && !b.DryRun {
			// Before the selection: the letters are then retried into a
			// user the limiter no longer blocks.
			if err := s.rl.Unblock(ctx, f.User); err != nil {
				return nil, err
			}
			plan.Unblocked = f.User
		}
		sel, err := s.dlq.Select(ctx, f, retry)
		if err != nil {
			return nil, err
		}
		plan.Selected = len(sel)
		ls := sel[:0:0]
		for _, l := range sel {
			switch l.Skip {
			case "":
				ls = append(ls, l)
			case SkipDone:
				plan.AlreadyDone++
			case SkipNotRetryable:
				plan.NotRetryable++
			case SkipSettled:
				plan.Settled++
			default:
				plan.Busy++
			}
		}
		plan.Count = len(ls)
		plan.Messages = countMessages(ls)
		plan.TopUsers, plan.Users = topUsers(ls, 20)
		plan.RateSeconds = float64(len(ls)) / float64(s.cfg.BatchRate)
		plan.Seconds = plan.RateSeconds
		if action == ActionRetry && s.cfg.RetryPace != nil {
			if allow, window, paced := s.cfg.RetryPace(); paced {
				plan.Pace = retryPacing(ls, allow, window)
				plan.Seconds = max(plan.Seconds, plan.Pace.SlowestSeconds)
			}
		}
		if action == ActionRetry {
			if plan.Blocked, err = s.blockedAmong(ctx, ls); err != nil {
				return nil, err
			}
		}
		if b.DryRun || len(ls) == 0 {
			return plan, nil
		}
		now := s.clock.Now()
		bt := &Batch{ID: id, Action: action, Filter: target, Who: principalFrom(ctx).name, Reason: reason,
			Rate: s.cfg.BatchRate, Total: len(ls), Users: plan.Users, State: BatchRunning, Created: now, IncludeInvalid: b.IncludeInvalid}
		started = true // named in the audit entry even if storing it fails
		if err := s.batches.start(ctx, bt, ls); err != nil {
			return nil, err
		}
		bt.Runner = s.batches.owner
		plan.Batch = bt
		return plan, nil
	}}, nil
}

// countMessages counts the messages of ls: letters with the same dedup
// key (Key) are one message; a letter without one is its own.
func countMessages(ls []Letter) int {
	seen := map[string]bool{}
	n := 0
	for _, l := range ls {
		if l.Key == "" {
			n++
			continue
		}
		if !seen[l.Key] {
			seen[l.Key] = true
			n++
		}
	}
	return n
}

// blockedRead is how many blocked users one read of the limiter's list
// takes; blockedPages bounds the reads of one plan.
const (
	blockedRead  = 500
	blockedPages = 200
)

// blockedAmong returns the users of ls the rate limiter blocks now (the
// limiter's list of blocked users, read page by page).
func (s *letters) blockedAmong(ctx context.Context, ls []Letter) ([]BlockedUser, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	users := map[string]bool{}
	for _, l := range ls {
		users[l.User] = true
	}
	var out []BlockedUser
	cursor := 0
	for range blockedPages {
		page, next, err := s.rl.ListBlocked(ctx, cursor, blockedRead)
		if err != nil {
			return nil, fmt.Errorf("reading the blocked users: %w", err)
		}
		for _, u := range page {
			if users[u.User] {
				out = append(out, u)
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	slices.SortFunc(out, func(a, b BlockedUser) int { return strings.Compare(a.User, b.User) })
	return out, nil
}

// filterTarget describes a batch's selection for the audit entry.
func filterTarget(f DLQFilter) string {
	t := "dlq:filter"
	if f.User != "" {
		t += " user=" + f.User
	}
	if f.Reason != "" {
		t += " reason=" + f.Reason
	}
	if f.Review != nil {
		if *f.Review {
			t += " review=true"
		} else {
			t += " review=false"
		}
	}
	if f.User == "" && f.Reason == "" && f.Review == nil {
		t += " all"
	}
	if f.Limit > 0 {
		t += " limit=" + itoa(f.Limit)
	}
	return t
}

func (s *letters) dlqBatchRetry(r *http.Request) (writeOp, *apiError) {
	return s.batchOp(r, ActionRetry)
}

func (s *letters) dlqPurge(r *http.Request) (writeOp, *apiError) { return s.batchOp(r, ActionPurge) }

// batchPage is the answer of GET /admin/dlq/batches.
type batchPage struct {
	Batches []Batch `json:"batches"`
}

func (s *letters) batchList(w http.ResponseWriter, r *http.Request) {
	bs, err := s.batches.list(r.Context())
	if e := s.storeError(err, "dlq.batches"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, batchPage{Batches: bs})
}

func (s *letters) batchGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if e := identifier("id", id, maxIDLen); e != nil {
		writeError(w, e)
		return
	}
	b, err := s.batches.get(r.Context(), id)
	if e := s.storeError(err, "dlq.batch"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *letters) batchCancel(r *http.Request) (writeOp, *apiError) {
	id, reason, e := pathAndReason(r, "id", maxIDLen)
	if e != nil {
		return writeOp{}, e
	}
	return writeOp{target: "dlq:batch " + id, reason: reason, do: func(r *http.Request) (any, error) {
		bt, err := s.batches.requestCancel(r.Context(), id, principalFrom(r.Context()).name)
		if err != nil {
			return nil, err
		}
		return bt, nil
	}}, nil
}

// groupsResponse is the answer of GET /admin/dlq/groups: the letters a
// filter selects, counted by reason and by user.
type groupsResponse struct {
	Total int `json:"total"`
	// Truncated: more letters match than were counted (maxBatchLimit).
	Truncated bool `json:"truncated"`
	// Done letters matched the filter but their message is done in the
	// dedup store (processed after all): left out of every count here.
	Done     int           `json:"done"`
	Users    int           `json:"users"`
	ByReason []reasonGroup `json:"by_reason"`
	// ByUser are the users with the most letters, most first.
	ByUser []userGroup `json:"by_user"`
}

type reasonGroup struct {
	Reason string `json:"reason"`
	Count  int    `json:"count"`
	Users  int    `json:"users"`
}

type userGroup struct {
	User    string         `json:"user"`
	Count   int            `json:"count"`
	Reasons map[string]int `json:"reasons"`
}

// groupedUsers is how many users GET /admin/dlq/groups lists.
const groupedUsers = 100

func (s *letters) dlqGroups(w http.ResponseWriter, r *http.Request) {
	f, e := s.queryFilter(r.URL.Query(), false)
	if e != nil {
		writeError(w, e)
		return
	}
	f.Limit = maxBatchLimit + 1
	// Selected as a retry's dry run would (acting on nothing), so that a
	// letter whose message is done after all is known: it is counted
	// apart, not among the letters an operator still has to deal with.
	sel, err := s.dlq.Select(r.Context(), f, &RetryOptions{DryRun: true, IncludeInvalid: true})
	if e := s.storeError(err, "dlq.groups"); e != nil {
		writeError(w, e)
		return
	}
	out := groupsResponse{ByReason: []reasonGroup{}, ByUser: []userGroup{}}
	if len(sel) > maxBatchLimit {
		sel, out.Truncated = sel[:maxBatchLimit], true
	}
	ls := sel[:0:0]
	for _, l := range sel {
		if l.Skip == SkipDone {
			out.Done++
			continue
		}
		ls = append(ls, l)
	}
	out.Total = len(ls)
	byReason := map[string]map[string]bool{}
	reasonCount := map[string]int{}
	users := map[string]*userGroup{}
	for _, l := range ls {
		if byReason[l.Reason] == nil {
			byReason[l.Reason] = map[string]bool{}
		}
		byReason[l.Reason][l.User] = true
		reasonCount[l.Reason]++
		u := users[l.User]
		if u == nil {
			u = &userGroup{User: l.User, Reasons: map[string]int{}}
			users[l.User] = u
		}
		u.Count++
		u.Reasons[l.Reason]++
	}
	for rsn, us := range byReason {
		out.ByReason = append(out.ByReason, reasonGroup{Reason: rsn, Count: reasonCount[rsn], Users: len(us)})
	}
	slices.SortFunc(out.ByReason, func(a, b reasonGroup) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.Reason, b.Reason)) })
	for _, u := range users {
		out.ByUser = append(out.ByUser, *u)
	}
	slices.SortFunc(out.ByUser, func(a, b userGroup) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.User, b.User)) })
	out.Users = len(out.ByUser)
	out.ByUser = out.ByUser[:min(len(out.ByUser), groupedUsers)]
	writeJSON(w, http.StatusOK, out)
}

// RetryPacing is how a retry's letters go back: at most Allow of one user's
// a window of WindowSeconds (the DLQ scheduler's rule, the default group's
// figures), so a user with many letters takes windows, whatever the
// batch's rate.
type RetryPacing struct {
	Allow         int     `json:"allow"`
	WindowSeconds float64 `json:"window_seconds"`
	// SlowestUser has the most letters; SlowestSeconds is how long after
	// the first of them the last goes back.
	SlowestUser    string  `json:"slowest_user"`
	SlowestLetters int     `json:"slowest_letters"`
	SlowestSeconds float64 `json:"slowest_seconds"`
	// PacedUsers have more letters than one window takes.
	PacedUsers int `json:"paced_users"`
}

// retryPacing applies the scheduler's pacing to the letters: a user's k
// letters go back allow a window, the last after ceil(k/allow)-1 windows.
func retryPacing(ls []Letter, allow int, window time.Duration) *RetryPacing {
	p := &RetryPacing{Allow: allow, WindowSeconds: window.Seconds()}
	counts := map[string]int{}
	for _, l := range ls {
		counts[l.User]++
	}
	for u, k := range counts {
		if k > allow {
			p.PacedUsers++
		}
		if k > p.SlowestLetters || (k == p.SlowestLetters && u < p.SlowestUser) {
			p.SlowestUser, p.SlowestLetters = u, k
		}
	}
	windows := (p.SlowestLetters+allow-1)/allow - 1
	p.SlowestSeconds = float64(max(windows, 0)) * window.Seconds()
	return p
}
