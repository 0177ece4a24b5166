package console

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/fleet"
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
	// commitSample is how often the server reads the group's offsets to
	// know how long each partition's commit has not moved.
	commitSample = 15 * time.Second
)

// commitAges remembers, per partition, the committed offset last seen and
// since when it has not moved.
type commitAges struct {
	mu    sync.Mutex
	first time.Time // the first sample
	seen  map[int32]commitMark
}

type commitMark struct {
	offset int64
	since  time.Time
}

// observe records lag's committed offsets at now and fills in each
// partition's commit age.
func (c *commitAges) observe(lag []PartitionLag, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen, c.first = map[int32]commitMark{}, now
	}
	for i := range lag {
		pl := &lag[i]
		m, ok := c.seen[pl.Partition]
		if !ok || m.offset != pl.Committed {
			m = commitMark{offset: pl.Committed, since: now}
			if !ok {
				m.since = c.first
			}
			c.seen[pl.Partition] = m
		}
		age := int64(now.Sub(m.since) / time.Second)
		pl.CommitAgeSeconds = &age
		pl.CommitAgeAtLeast = m.since.Equal(c.first)
	}
}

// sampleCommits reads the group's offsets every commitSample until the
// server closes, so commit ages are known before anyone opens the console.
func (s *watch) sampleCommits() {
	p := s.cfg.Pipeline
	if p == nil {
		return
	}
	tick := time.NewTicker(commitSample)
	defer tick.Stop()
	for {
		if lag, err := p.Lag(s.life); err == nil {
			s.commits.observe(lag, s.clock.Now().UTC())
		}
		select {
		case <-s.life.Done():
			return
		case <-tick.C:
		}
	}
}

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
	// Consumers are the schedule-consumers' published statuses; Actors
	// and OpenBreakers sum the fresh ones.
	Consumers      []ConsumerStatus `json:"consumers"`
	ConsumersError string           `json:"consumers_error,omitempty"`
	Actors         int              `json:"actors"`
	OpenBreakers   int              `json:"open_breakers"`
}

func (s *watch) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := s.clock.Now().UTC()
	o := overviewResponse{Time: now, Accounts: []accountView{}, Partitions: []PartitionLag{}, Consumers: []ConsumerStatus{},
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
		if cs, err := p.Consumers(ctx); err != nil {
			o.ConsumersError = err.Error()
		} else {
			slices.SortFunc(cs, func(a, b ConsumerStatus) int { return strings.Compare(a.Node, b.Node) })
			for i := range cs {
				// One rule for a silent daemon (fleet.Judge): the status
				// reader leaves out those gone; stale ones are shown, not
				// counted.
				if fleet.Judge(cs[i].Reported, now) != fleet.Live {
					cs[i].Stale = true
					continue
				}
				o.Actors += cs[i].Actors
				o.OpenBreakers += cs[i].OpenBreakers
			}
			if cs != nil {
				o.Consumers = cs
			}
		}
		if lag, err := p.Lag(ctx); err != nil {
			o.LagError = err.Error()
		} else {
			s.commits.observe(lag, now)
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
		o.ConsumersError = o.AccountsError
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
