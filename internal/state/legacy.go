package state

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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

// The old stores' marks are read only while they can exist. The first
// store that starts on a deployment with Legacy set looks for any key of
// the old stores (a SCAN under Prefix, stopped at the first key) and
// records what it found in <KeyPrefix>st:legacy: "none" when there was
// none (a new deployment, or one switched over longer than a TTL ago),
// else the Unix milliseconds one TTL later, when the last of them has
// expired. Every later start reads the record. Until the decision is made
// (or when it cannot be: Redis unreachable), the old marks are read, as
// before. So dedup.legacy: read costs nothing where there is nothing to
// read, and stops by itself one TTL after the switch.

// legacyOn reports whether look-ups read the old stores' marks now.
func (s *Store) legacyOn() bool {
	if !s.cfg.Legacy.on() {
		return false
	}
	u := s.legacyUntil.Load()
	return u == 0 || time.Now().UnixMilli() < u
}

// legacyKey is the deployment's record of the old stores' marks.
func (s *Store) legacyKey() string { return s.cfg.KeyPrefix + "st:legacy" }

// decideLegacy reads the record (writing it first when there is none),
// trying again every minute while Redis does not answer, until its client
// is closed (the daemon stops).
func (s *Store) decideLegacy() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := s.readLegacy(ctx)
		cancel()
		if err == nil || errors.Is(err, redis.ErrClosed) {
			return
		}
		time.Sleep(time.Minute)
	}
}

// readLegacy sets legacyUntil from the record, writing it when absent.
func (s *Store) readLegacy(ctx context.Context) error {
	c, key := s.cfg.Client, s.legacyKey()
	v, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		rec, ttl := "none", time.Duration(0)
		found, ferr := anyKey(ctx, c, s.cfg.Legacy.Prefix+"*")
		if ferr != nil {
			return ferr
		}
		if found {
			rec, ttl = strconv.FormatInt(time.Now().Add(s.cfg.TTL).UnixMilli(), 10), s.cfg.TTL+24*time.Hour
		}
		// The first decision wins; every store adopts it.
		if serr := c.SetNX(ctx, key, rec, ttl).Err(); serr != nil {
			return serr
		}
		v, err = c.Get(ctx, key).Result()
	}
	if err != nil {
		return err
	}
	if v == "none" {
		s.legacyUntil.Store(-1)
		return nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return fmt.Errorf("state: %s holds %q, not \"none\" or a time", key, v)
	}
	s.legacyUntil.Store(ms)
	return nil
}

// anyKey reports whether a key matches match (on a Redis Cluster, on any
// master), stopping at the first.
func anyKey(ctx context.Context, client redis.UniversalClient, match string) (bool, error) {
	scan := func(ctx context.Context, c redis.Cmdable) (bool, error) {
		for cursor := uint64(0); ; {
			keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil || len(keys) > 0 {
				return len(keys) > 0, err
			}
			if cursor = next; cursor == 0 {
				return false, nil
			}
		}
	}
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, client)
	}
	var found atomic.Bool
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		f, err := scan(ctx, m)
		if f {
			found.Store(true)
		}
		return err
	})
	return found.Load(), err
}

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
