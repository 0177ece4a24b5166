// Package fleet is the list of running kfpipe daemons, kept in coord's
// service registry: each daemon joins it when it starts (role, node, ops
// and admin addresses, version, and what it works on — a kf-producer's
// worker ID, a schedule-consumer's partitions and live actors), updates
// its entry when that changes, and leaves it when it stops. A killed daemon
// leaves when its lease expires (coord.keep_alive). The admin API reads the
// fleet through a View, which follows the registry's watch.
package fleet

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/coord"
)

// Service is the registry service every daemon registers under.
const Service = "kfpipe"

// Member is one running daemon.
type Member struct {
	// ID is unique per process: role, node and pid.
	ID        string    `json:"id"`
	Role      string    `json:"role"`
	Node      string    `json:"node"`
	Version   string    `json:"version"`
	OpsAddr   string    `json:"ops_addr"`
	AdminAddr string    `json:"admin_addr,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// WorkerID is a kf-producer's Snowflake worker ID (-1: none held).
	WorkerID int `json:"worker_id"`
	// Partitions and Actors are a schedule-consumer's assigned main-topic
	// partitions and live per-user actors.
	Partitions []int32 `json:"partitions"`
	Actors     int     `json:"actors"`
	// LastHeard is set on a member whose registry lease expired: when it
	// was last heard from. Stale: silent for StaleAfter (see Judge); such
	// a member is shown, not counted as running.
	LastHeard *time.Time `json:"last_heard,omitempty"`
	Stale     bool       `json:"stale,omitempty"`
}

// leavingKey marks an entry whose daemon is stopping cleanly (Leave), so
// the View drops it at once instead of showing it stale.
const leavingKey = "leaving"

// NewMember returns the Member of this process for role.
func NewMember(role, version, opsAddr string) Member {
	node, err := os.Hostname()
	if err != nil || node == "" {
		node = "unknown"
	}
	return Member{ID: fmt.Sprintf("%s-%s-%d", role, sanitize(node), os.Getpid()), Role: role, Node: node,
		Version: version, OpsAddr: opsAddr, StartedAt: time.Now().UTC().Truncate(time.Second), WorkerID: -1}
}

// sanitize makes s usable in a registry ID (one key segment).
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, s)
}

func (m Member) info() coord.ServiceInfo {
	md := map[string]string{"role": m.Role, "node": m.Node, "worker_id": strconv.Itoa(m.WorkerID),
		"actors": strconv.Itoa(m.Actors)}
	if m.AdminAddr != "" {
		md["admin_addr"] = m.AdminAddr
	}
	if len(m.Partitions) > 0 {
		ps := make([]string, len(m.Partitions))
		for i, p := range m.Partitions {
			ps[i] = strconv.Itoa(int(p))
		}
		md["partitions"] = strings.Join(ps, ",")
	}
	return coord.ServiceInfo{Name: Service, ID: m.ID, Addr: m.OpsAddr, Metadata: md, Version: m.Version, StartedAt: m.StartedAt}
}

func fromInfo(in coord.ServiceInfo) Member {
	md := in.Metadata
	m := Member{ID: in.ID, Role: md["role"], Node: md["node"], Version: in.Version, OpsAddr: in.Addr,
		AdminAddr: md["admin_addr"], StartedAt: in.StartedAt, WorkerID: -1, Partitions: []int32{}}
	if v, err := strconv.Atoi(md["worker_id"]); err == nil {
		m.WorkerID = v
	}
	m.Actors, _ = strconv.Atoi(md["actors"])
	if ps := md["partitions"]; ps != "" {
		for _, s := range strings.Split(ps, ",") {
			if v, err := strconv.Atoi(s); err == nil {
				m.Partitions = append(m.Partitions, int32(v))
			}
		}
	}
	return m
}

// Self is this process's entry in the fleet.
type Self struct {
	reg *coord.Registry
	log *zap.Logger

	mu sync.Mutex
	m  Member
}

// Join registers m (on a lease of coord.keep_alive, kept alive in the
// background and registered again after a loss).
func Join(ctx context.Context, p *coord.Provider, m Member, log *zap.Logger) (*Self, error) {
	if err := p.Registry().Register(ctx, m.info(), 0); err != nil {
		return nil, fmt.Errorf("fleet: join as %s: %w", m.ID, err)
	}
	log.Info("joined the fleet", zap.String("id", m.ID), zap.String("role", m.Role))
	return &Self{reg: p.Registry(), log: log, m: m}, nil
}

// Member returns this process's entry as last written.
func (s *Self) Member() Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

// Update applies edit to the entry and writes it if it changed. A failed
// write is logged; the next change writes the whole entry again.
func (s *Self) Update(ctx context.Context, edit func(*Member)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.m
	m.Partitions = slices.Clone(m.Partitions)
	edit(&m)
	if slices.Equal(m.Partitions, s.m.Partitions) && m.WorkerID == s.m.WorkerID && m.Actors == s.m.Actors &&
		m.AdminAddr == s.m.AdminAddr {
		return
	}
	if err := s.reg.Update(ctx, m.info()); err != nil {
		s.log.Warn("fleet: update of this daemon's entry failed", zap.String("id", m.ID), zap.Error(err))
		return
	}
	s.m = m
}

// Leave removes the entry (a graceful stop; a killed process leaves when
// its lease expires, and is shown stale for a while, see View). The entry
// is first marked as leaving, so that views drop it at once; if that write
// fails the daemon is merely shown stale until it is gone.
func (s *Self) Leave(ctx context.Context) error {
	s.mu.Lock()
	info := s.m.info()
	s.mu.Unlock()
	info.Metadata[leavingKey] = "true"
	if err := s.reg.Update(ctx, info); err != nil {
		s.log.Debug("fleet: mark as leaving", zap.String("id", info.ID), zap.Error(err))
	}
	if err := s.reg.Unregister(ctx, s.m.ID); err != nil {
		return fmt.Errorf("fleet: leave: %w", err)
	}
	return nil
}
