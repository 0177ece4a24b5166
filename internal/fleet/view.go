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
type View struct {
	mu      sync.Mutex
	members map[string]Member
	changed time.Time // last event applied
	done    chan struct{}
}

// Watch starts a View; it follows the registry until ctx ends or the
// Provider is closed.
func Watch(ctx context.Context, p *coord.Provider) (*View, error) {
	ch, err := p.Registry().Watch(ctx, Service)
	if err != nil {
		return nil, fmt.Errorf("fleet: watch: %w", err)
	}
	v := &View{members: map[string]Member{}, done: make(chan struct{})}
	go v.follow(ch)
	return v, nil
}

func (v *View) follow(ch <-chan coord.RegistryEvent) {
	defer close(v.done)
	for e := range ch {
		v.mu.Lock()
		switch e.Type {
		case coord.ServiceAdded, coord.ServiceUpdated:
			v.members[e.Service.ID] = fromInfo(e.Service)
		case coord.ServiceRemoved:
			delete(v.members, e.Service.ID)
		}
		v.changed = time.Now()
		v.mu.Unlock()
	}
}

// Done is closed when the View stops following the registry.
func (v *View) Done() <-chan struct{} { return v.done }

// Members returns the fleet, by role and then ID, and when it last
// changed.
func (v *View) Members() ([]Member, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]Member, 0, len(v.members))
	for _, m := range v.members {
		m.Partitions = slices.Clone(m.Partitions)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.ID, b.ID)) })
	return out, v.changed
}
