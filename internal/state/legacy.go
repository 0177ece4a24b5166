package state

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Legacy names the keys of the dedup stores this one replaces, read (never
// written) for one dedup TTL after the switch so that a message handled
// before it is not run again (docs/operations.md, "Switching to the
// per-partition store"). Both layouts live under Prefix (the deployment's
// dedup prefix, "<redis prefix>dedup:"):
//   - claims: a string per message, <Prefix><key>, "d:…" once done, "p:…"
//     while an owner's claim runs;
//   - leases: per user and day of send time a set of FNV-1a 64-bit digests,
//     <Prefix>u:D:<user>:<day>, and per user a lease <Prefix>u:L:<user>.
type Legacy struct {
	Prefix string
	Claims bool
	Leases bool
}

func (l *Legacy) on() bool { return l != nil && (l.Claims || l.Leases) }

// Status is what a look-up found for a message.
type Status uint8

// Look-up results.
const (
	// Fresh: no mark; run the message.
	Fresh Status = iota
	// Done: marked done (by this store or, while Legacy is set, an old one).
	Done
	// Held: an old store's claim or user lease is in force (a consumer of
	// the old store may be running it): look again later, never run it now.
	Held
)

func (s Status) String() string {
	switch s {
	case Done:
		return "done"
	case Held:
		return "held"
	}
	return "fresh"
}

// fnvDigest is the leases store's digest (FNV-1a 64, as a signed integer).
func fnvDigest(key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64())
}

// legacyLook fills st for the items not found done here, from the old
// stores' keys: one pipeline.
func (s *Store) legacyLook(ctx context.Context, items []Item, st []Status) error {
	lg := s.cfg.Legacy
	pipe := s.cfg.Client.Pipeline()
	type q struct {
		i            int
		claim, lease *redis.StringCmd
		day          *redis.BoolCmd
	}
	var qs []q
	for i, it := range items {
		if st[i] != Fresh {
			continue
		}
		e := q{i: i}
		if lg.Claims {
			e.claim = pipe.Get(ctx, lg.Prefix+it.Key)
		}
		if lg.Leases && it.User != "" {
			e.day = pipe.SIsMember(ctx, lg.Prefix+"u:D:"+it.User+":"+strconv.FormatInt(dayOf(it.SendTime), 10), fnvDigest(it.Key))
			e.lease = pipe.Get(ctx, lg.Prefix+"u:L:"+it.User)
		}
		qs = append(qs, e)
	}
	if len(qs) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("state: look up the old stores' marks: %w", err)
	}
	for _, e := range qs {
		if e.claim != nil {
			switch v := e.claim.Val(); {
			case strings.HasPrefix(v, "d:"):
				st[e.i] = Done
				continue
			case strings.HasPrefix(v, "p:"):
				st[e.i] = Held
			}
		}
		if e.day != nil {
			if e.day.Val() {
				st[e.i] = Done
				continue
			}
			if e.lease.Val() != "" {
				st[e.i] = Held
			}
		}
	}
	return nil
}
