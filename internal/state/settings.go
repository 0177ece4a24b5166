package state

import (
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// DefaultTTL is dedup.ttl's default: ten days, WeChat's 3-day re-pull
// window plus the DLQ's default retry horizon (a week), which it must
// cover together: a copy re-pulled on day 3 and dead-lettered without a
// look-up (refused by the limiter, the breaker or a full mailbox) stays
// retryable a horizon from its own failure (issue 43, item 5).
const DefaultTTL = MinTTL + 7*24*time.Hour

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
// (config.Dedup) and checks it there, and Config takes its values with
// what the program supplies (the client, the owner).
type Settings struct {
	// TTL is how long a message's done mark is kept after it was written:
	// at least WeChat's re-pull window (3 days) plus the DLQ's longest
	// retry horizon (recovery.default_ttl, recovery.ttl), since a copy
	// re-pulled on day 3 and dead-lettered stays retryable a horizon from
	// its own failure. The cost a message does not depend on it.
	TTL time.Duration `mapstructure:"ttl" default:"state.DefaultTTL" range:"[state.MinTTL,]"`
	// Lease is how long a consumer's hold on a partition (its lease,
	// with the fencing token its handlers get) lives without renewal: it
	// bounds how long a crashed or frozen consumer's partitions wait
	// before another consumer takes them (about the group session
	// timeout), while a live owner renews it every quarter lease and
	// stops its handlers once it was not renewed by its deadline. There
	// are no per-message claims. At least 1s (stricter than the store's
	// own minimum, which is for its tests): a lease renewed every lease/4
	// must survive a GC pause.
	Lease time.Duration `mapstructure:"lease" default:"state.DefaultLease" range:"[1s, state.MaxLease]"`
	// Store is no longer a setting (one per-partition store); it is read
	// only to refuse a configuration that still sets it.
	Store string `mapstructure:"store"`
	// Legacy: read (the default) also looks a message up among the marks
	// of the old dedup stores (claims and leases) while they can exist: the
	// first start on a deployment records whether it found any key of
	// theirs (<prefix>st:legacy), and they are read for one dedup.ttl from
	// then, or never where there was none. off never reads them
	// (docs/operations.md, "Switching to the per-partition store").
	Legacy string `mapstructure:"legacy" default:"read" enum:"off|read"`
	// Buckets is how many digest sets a partition's done marks of one
	// 10-second send-time slot are spread over when the partition is new;
	// from then on the partition's owner sizes each new slot from the
	// rate it observes (about 400 marks a set, so that each stays a Redis
	// intset: 8 B a mark), and every earlier slot keeps the count it was
	// written with while its marks may live. No sizing is needed: a value
	// only saves the first slots of a busy new partition from oversized
	// sets, and a changed value changes no existing partition.
	Buckets int `mapstructure:"buckets" default:"state.DefaultBuckets" range:"[1, state.MaxBuckets]"`
}
