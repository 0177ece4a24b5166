package admin

import (
	"net/http"
)

func (s *Server) dlqStats(w http.ResponseWriter, r *http.Request) {
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

func (s *Server) dlqList(w http.ResponseWriter, r *http.Request) {
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

func (s *Server) dlqGet(w http.ResponseWriter, r *http.Request) {
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

func (s *Server) dlqRetry(r *http.Request) (writeOp, *apiError) {
	id := r.PathValue("id")
	if e := identifier("id", id, maxIDLen); e != nil {
		return writeOp{}, e
	}
	var b reasonBody
	if e := decodeBody(r, &b); e != nil {
		return writeOp{}, e
	}
	reason, e := auditReason(b.Reason, r.URL.Query())
	if e != nil {
		return writeOp{}, e
	}
	return writeOp{target: "dlq:" + id, reason: reason, do: func(r *http.Request) (any, error) {
		return okResponse{OK: true}, s.dlq.Retry(r.Context(), id)
	}}, nil
}

// batchBody is the body of batch-retry and purge. The filter's "reason" is
// the failure reason; the top-level "reason" is why the operator acts.
// DryRun answers the count the write would act on, acting on nothing.
type batchBody struct {
	Filter *batchFilter `json:"filter"`
	Reason string       `json:"reason"`
	DryRun bool         `json:"dry_run"`
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

// countResponse answers batch writes; DryRun echoes a dry run (Count is
// then what the write would have acted on).
type countResponse struct {
	Count  int  `json:"count"`
	DryRun bool `json:"dry_run,omitempty"`
}

func (s *Server) batchOp(r *http.Request, run func(*http.Request, DLQFilter) (int, error)) (writeOp, *apiError) {
	var b batchBody
	if e := decodeBody(r, &b); e != nil {
		return writeOp{}, e
	}
	reason, e := auditReason(b.Reason, r.URL.Query())
	if e != nil {
		return writeOp{}, e
	}
	if b.Filter == nil {
		return writeOp{}, unprocessable("filter", `filter is required, e.g. {"filter": {"user": "u1"}}; {"filter": {"all": true}} selects everything`)
	}
	bf := *b.Filter
	f := DLQFilter{User: bf.User, Reason: bf.Reason, Review: bf.Review, Limit: bf.Limit, DryRun: b.DryRun}
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
	return writeOp{target: filterTarget(f), reason: reason, dryRun: b.DryRun, do: func(r *http.Request) (any, error) {
		n, err := run(r, f)
		return countResponse{Count: n, DryRun: b.DryRun}, err
	}}, nil
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

func (s *Server) dlqBatchRetry(r *http.Request) (writeOp, *apiError) {
	return s.batchOp(r, func(r *http.Request, f DLQFilter) (int, error) { return s.dlq.BatchRetry(r.Context(), f) })
}

func (s *Server) dlqPurge(r *http.Request) (writeOp, *apiError) {
	return s.batchOp(r, func(r *http.Request, f DLQFilter) (int, error) { return s.dlq.Purge(r.Context(), f) })
}
