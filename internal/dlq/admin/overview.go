package admin

import (
	"net/http"
	"time"
)

// WeChat keeps a customer-service message for 72 hours: one not synced by
// then is lost. The overview grades each account against it as the alerts
// do (KfpipeWeChatHorizonWarning at 24 h waiting, …Critical at 48 h).
const (
	horizon         = 72 * time.Hour
	horizonWarning  = 24 * time.Hour
	horizonCritical = 48 * time.Hour
	// statusStale: kf-producer publishes every 10 s; a status older than
	// this comes from a replica that stopped or lost Redis.
	statusStale = time.Minute
	// The DLQ inflow chart: the last hour in 5-minute buckets.
	inflowStep    = 5 * time.Minute
	inflowBuckets = 12
)

// accountView is one account in the overview.
type accountView struct {
	AccountSync
	// State is ok, warning (waiting ≥ 24 h), critical (≥ 48 h), or stale
	// (no status for a minute: the horizon is unknown).
	State string `json:"state"`
	// WaitingSeconds is how long the oldest message may have waited; 0
	// when nothing waits.
	WaitingSeconds int64 `json:"waiting_seconds"`
	// HorizonLeftSeconds is how long until WeChat drops the oldest waiting
	// message (72 h after it); absent when nothing waits.
	HorizonLeftSeconds *int64 `json:"horizon_left_seconds,omitempty"`
}

type inflowView struct {
	To          time.Time          `json:"to"`
	StepSeconds int64              `json:"step_seconds"`
	ByReason    map[string][]int64 `json:"by_reason"`
}

// overviewResponse is the answer of GET /admin/overview: what the
// console's first page shows. A part that could not be read has its error
// beside it (accounts_error, lag_error, inflow_error) and the rest answers.
type overviewResponse struct {
	Time          time.Time      `json:"time"`
	Accounts      []accountView  `json:"accounts"`
	AccountsError string         `json:"accounts_error,omitempty"`
	Partitions    []PartitionLag `json:"partitions"`
	LagTotal      int64          `json:"lag_total"`
	// EndTotal and CommittedTotal are the sums of the partitions' offsets:
	// two overviews apart give the throughput in and out.
	EndTotal       int64      `json:"end_total"`
	CommittedTotal int64      `json:"committed_total"`
	LagError       string     `json:"lag_error,omitempty"`
	DLQ            DLQStats   `json:"dlq"`
	Inflow         inflowView `json:"inflow"`
	InflowError    string     `json:"inflow_error,omitempty"`
	// BlockedUsers counts the users blocked now, up to 10000.
	BlockedUsers       int  `json:"blocked_users"`
	BlockedUsersCapped bool `json:"blocked_users_capped"`
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := s.clock.Now().UTC()
	o := overviewResponse{Time: now, Accounts: []accountView{}, Partitions: []PartitionLag{},
		Inflow: inflowView{To: now, StepSeconds: int64(inflowStep / time.Second), ByReason: map[string][]int64{}}}
	st, err := s.dlq.Stats(ctx)
	if e := s.storeError(err, "overview.dlq"); e != nil {
		writeError(w, e)
		return
	}
	if st.ByReason == nil {
		st.ByReason = map[string]int64{}
	}
	o.DLQ = st
	if o.BlockedUsers, o.BlockedUsersCapped, err = s.countBlocked(r); err != nil {
		writeError(w, s.storeError(err, "overview.blocked"))
		return
	}
	if in, err := s.dlq.Inflow(ctx, now, inflowStep, inflowBuckets); err != nil {
		o.InflowError = err.Error()
	} else {
		o.Inflow.ByReason = in
	}
	if p := s.cfg.Pipeline; p != nil {
		if accts, err := p.Accounts(ctx); err != nil {
			o.AccountsError = err.Error()
		} else {
			for _, a := range accts {
				o.Accounts = append(o.Accounts, gradeAccount(a, now))
			}
		}
		if lag, err := p.Lag(ctx); err != nil {
			o.LagError = err.Error()
		} else {
			o.Partitions = lag
			for _, pl := range lag {
				o.LagTotal += pl.Lag
				o.EndTotal += pl.End
				o.CommittedTotal += max(pl.Committed, 0)
			}
		}
	} else {
		o.AccountsError = "not available: the admin API was started without the pipeline's view"
		o.LagError = o.AccountsError
	}
	writeJSON(w, http.StatusOK, o)
}

// gradeAccount places a at now against WeChat's 72-hour horizon.
func gradeAccount(a AccountSync, now time.Time) accountView {
	v := accountView{AccountSync: a, State: "ok"}
	if a.OldestWaiting != nil {
		waited := now.Sub(*a.OldestWaiting)
		left := int64(a.OldestWaiting.Add(horizon).Sub(now) / time.Second)
		v.WaitingSeconds, v.HorizonLeftSeconds = int64(waited/time.Second), &left
		switch {
		case waited >= horizonCritical:
			v.State = "critical"
		case waited >= horizonWarning:
			v.State = "warning"
		}
	}
	if v.State == "ok" && now.Sub(a.Reported) > statusStale {
		v.State = "stale"
	}
	return v
}
