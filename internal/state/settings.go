package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// DefaultTTL is dedup.ttl's default: a week, beyond WeChat's 3-day
// re-pull window and as long as the DLQ's default retry horizon, which it
// must cover.
const DefaultTTL = 7 * 24 * time.Hour

// MinTTL is dedup.ttl's least value: WeChat may hand a message out again
// for 3 days (I3).
const MinTTL = 72 * time.Hour

// Names are the values Settings' tags (and those of other sections mapped
// onto the store: processor.pipeline_flush, processor.pipeline_max_batched)
// name; internal/config's registry includes them.
var Names = schema.Names{
	"state.DefaultTTL":     DefaultTTL,
	"state.MinTTL":         MinTTL,
	"state.DefaultLease":   DefaultLease,
	"state.DefaultBuckets": DefaultBuckets,
	"state.MaxLease":       MaxLease,
	"state.MaxFlush":       MaxFlush,
	"state.MaxBatch":       MaxBatch,
	"state.MaxBuckets":     MaxBuckets,
}

// Settings configures the idempotency keys (I3): the done marks and
// partition leases of the consumer-state store.
//
// It is the schedule-consumer's dedup section, owned here with its
// defaults and bounds (the tags; docs/config.md is generated from them);
// internal/config composes it into the daemon's configuration
// (config.Dedup), and Config takes its values with what the program
// supplies (the client, the owner).
type Settings struct {
	// TTL is how long a message's done mark is kept: at least WeChat's
	// re-pull window (3 days) and the DLQ's retry horizon
	// (recovery.default_ttl, recovery.ttl).
	TTL time.Duration `mapstructure:"ttl" default:"state.DefaultTTL" range:"[state.MinTTL,]"`
	// Lease is how long a "processing" claim lives without renewal: it
	// bounds how long a crashed consumer's users wait for their claims
	// (about the group session timeout), while a live owner renews it
	// every quarter lease and stops its handler after two thirds without a
	// successful renewal. At least 1s (stricter than the store's own
	// minimum, which is for its tests): a claim renewed every lease/4 must
	// survive a GC pause.
	Lease time.Duration `mapstructure:"lease" default:"state.DefaultLease" range:"[1s, state.MaxLease]"`
	// Store is no longer a setting (one per-partition store); it is read
	// only to refuse a configuration that still sets it.
	Store string `mapstructure:"store"`
	// Legacy: read (the default) also looks a message up among the marks
	// of the old dedup stores (claims and leases), off does not. Keep it
	// read for one dedup.ttl after switching from either
	// (docs/operations.md, "Switching to the per-partition store").
	Legacy string `mapstructure:"legacy" default:"read" enum:"off|read"`
	// Buckets is how many digest sets a partition's done marks of one
	// 10-second send-time slot are spread over, so that each stays a Redis
	// intset (at most ~400 members: 8 B a mark; beyond 512 Redis converts
	// it to a hash table, ~70 B a mark). Size it as messages a second per
	// partition × 10 / 400, rounded up to a power of two: 1 up to ~40 msg/s
	// a partition, 16 for the seeds' 5,000 msg/s over 12 partitions. A
	// change applies from the next slot, at most once per dedup.ttl (the
	// marks written before stay found; docs/operations.md).
	Buckets int `mapstructure:"buckets" default:"state.DefaultBuckets" range:"[1, state.MaxBuckets]"`
}

// Validate reports every setting out of its bounds, each by its dedup.*
// key, and a store that is still set.
func (s Settings) Validate() error {
	var errs []error
	if err := Names.Check("dedup", s); err != nil {
		errs = append(errs, err)
	}
	if s.Store != "" {
		errs = append(errs, fmt.Errorf("dedup.store is set (%q), but there is one consumer-state store now (per partition) and no choice: delete the key; "+
			"a deployment of the claims or leases store switches as docs/operations.md says (\"Switching to the per-partition store\")", s.Store))
	}
	return errors.Join(errs...)
}
