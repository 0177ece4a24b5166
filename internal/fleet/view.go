package fleet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord"
)

// View is the fleet as the registry's watch reports it: it starts with the
// registered daemons and follows every join, update and leave (a watch
// that breaks resumes where it stopped; see coord.Registry.Watch). While
// etcd is unreachable it keeps the last fleet it saw.
//
// A daemon that leaves (a clean stop) is gone at once. One whose lease
// expired (killed, or cut off from etcd) was last heard from a lease TTL
// before: it is shown stale, and gone when Judge says so, as the
// consumers' status reports are.
type View struct {
	keepAlive time.Duration
	now       func() time.Time

	mu      sync.Mutex
	members map[string]Member
	// silent are the members whose lease expired, with when they were last
	// heard from.
	silent  map[string]silentMember
	changed time.Time // last event applied
	done    chan struct{}
}

type silentMember struct {
	m     Member
	heard time.Time
}

// Watch starts a View; it follows the registry until ctx ends or the
// Provider is closed. keepAlive is the daemons' registry lease
// (coord.keep_alive; 0: coord's default).
func Watch(ctx context.Context, p *coord.Provider, keepAlive time.Duration) (*View, error) {
	ch, err := p.Registry().Watch(ctx, Service)
	if err != nil {
		return nil, fmt.Errorf("fleet: watch: %w", err)
	}
	v := newView(keepAlive, time.Now)
	go v.follow(ch)
	return v, nil
}

func newView(keepAlive time.Duration, now func() time.Time) *View {
	if keepAlive <= 0 {
		keepAlive = coord.DefaultKeepAlive
	}
	return &View{keepAlive: keepAlive, now: now, members: map[string]Member{}, silent: map[string]silentMember{},
		done: make(chan struct{})}
}

func (v *View) follow(ch <-chan coord.RegistryEvent) {
	defer close(v.done)
	for e := range ch {
		v.apply(e)
	}
}

func (v *View) apply(e coord.RegistryEvent) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	id := e.Service.ID
	switch e.Type {
	case coord.ServiceAdded, coord.ServiceUpdated:
		v.members[id] = fromInfo(e.Service)
		delete(v.silent, id)
	case coord.ServiceRemoved:
		delete(v.members, id)
		if e.Service.Metadata[leavingKey] == "" {
			v.silent[id] = silentMember{m: fromInfo(e.Service), heard: now.Add(-v.keepAlive)}
		}
	}
	v.changed = now
}

// Done is closed when the View stops following the registry.
func (v *View) Done() <-chan struct{} { return v.done }

// Members returns the fleet, by role and then ID, and when it last
// changed: the registered daemons, and those whose lease expired until
// Judge says they are gone (with Stale and LastHeard set).
func (v *View) Members() ([]Member, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	out := make([]Member, 0, len(v.members)+len(v.silent))
	for _, m := range v.members {
		m.Partitions = slices.Clone(m.Partitions)
		out = append(out, m)
	}
	for id, s := range v.silent {
		if Judge(s.heard, now) == Gone {
			delete(v.silent, id)
			continue
		}
		// Stale at once, even within StaleAfter of heard: the registry
		// has already found it silent for a whole lease.
		s.m.Stale = true
		heard := s.heard
		s.m.LastHeard = &heard
		s.m.Partitions = slices.Clone(s.m.Partitions)
		out = append(out, s.m)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.ID, b.ID)) })
	return out, v.changed
}
