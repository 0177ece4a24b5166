// Package state keeps the consumer's state in Redis per partition, not per
// message or per user (invariant I3, issue #30).
//
// A consumer owns a partition exclusively between rebalances; Store makes
// that ownership explicit: on assignment the consumer takes the
// partition's lease (Acquire), which carries a fencing token that only
// grows, renews it while it holds the partition, and gives it back on
// revoke (Lease.Release); the next owner waits for the release or the
// lease's expiry. Done marks are digests of the messages' idempotency keys
// added, a batch at a time, to sets bucketed by partition, send-time slot
// and hash: sets of at most 512 integers, which Redis keeps as intsets (8
// bytes a member). One mark script call per batch checks the token and
// records the batch: a mark whose lease moved is still recorded (an
// effect that happened is a fact) and reported as ErrFenced, so that its
// owner stops and commits nothing more.
//
// Most messages are provably first deliveries and need no look-up before
// their handler runs (see Lease.MayRepeat): only offsets a previous owner
// may have handled, letters the DLQ re-injects and pages the producer
// flags as possible repeats are looked up (Lease.Seen).
//
// Every key of a partition carries the hash tag {<topic>:<partition>}, so
// each script's keys share a Redis Cluster slot; there is no global key.
package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

// Defaults.
const (
	DefaultLease   = 10 * time.Second
	DefaultSlot    = 10 * time.Second
	DefaultBuckets = 1
	// MaxIntset is Redis's set-max-intset-entries default: a bucket
	// beyond it is converted to a hash table (~5× the bytes a member).
	MaxIntset = 512
)

// ErrFenced means the partition's lease is held by another owner: the
// marks were recorded, but this owner must stop handling the partition
// and commit nothing more.
var ErrFenced = errors.New("state: partition lease held by another owner (fenced)")

// ErrLost means the lease was not renewed in time (Redis unreachable for
// most of a lease, or another owner took it).
var ErrLost = errors.New("state: partition lease lost")

// Bounds of the settings the consumer's configuration maps onto the store
// (dedup.lease, processor.pipeline_flush, processor.pipeline_max_batched,
// dedup.buckets): the one definition, which internal/config's range tags
// name.
const (
	MaxLease   = 24 * time.Hour
	MaxFlush   = 100 * time.Millisecond
	MaxBatch   = 10000
	MaxBuckets = 1 << 16
)

// Config configures a Store.
type Config struct {
	// Client is the Redis client (required).
	Client redis.UniversalClient
	// KeyPrefix starts every key (e.g. "kfpipe:").
	KeyPrefix string
	// Owner names this process in the ownership records (a random suffix
	// is appended).
	Owner string
	// Lease is how long an acquisition or renewal holds a partition.
	Lease time.Duration
	// TTL is how long a done mark is kept after its bucket's last write.
	// It must cover WeChat's 3-day re-pull window plus the DLQ's retry
	// horizon.
	TTL time.Duration
	// Slot is the send-time span of one bucket set (every owner of a
	// partition must use the same value while marks live); Buckets is the
	// number of hash buckets per slot a new partition starts with: from
	// then on its owner's Marker sizes each new slot from the observed
	// rate (see layout).
	Slot    time.Duration
	Buckets int
	// Legacy, when set, makes look-ups also read the old dedup stores'
	// keys: for one dedup TTL after switching to this store.
	Legacy *Legacy
	// Partitions, when set, tells a topic's partition count (Kafka's
	// metadata): Acquire records it, so that after partitions are added
	// look-ups also ask the partition a user had before (see
	// RecordPartitions).
	Partitions func(ctx context.Context, topic string) (int, error)
}

func (c *Config) setDefaults() {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Slot == 0 {
		c.Slot = DefaultSlot
	}
	if c.Buckets == 0 {
		c.Buckets = DefaultBuckets
	}
}

// SuggestBuckets returns the buckets per partition and slot that keep a
// bucket under ~400 members (room below MaxIntset for bursts) at rate
// messages per second over partitions partitions.
func SuggestBuckets(rate float64, partitions int, slot time.Duration) int {
	per := rate / float64(max(partitions, 1)) * slot.Seconds()
	b := 1
	for float64(b)*400 < per && b < 1<<16 {
		b *= 2
	}
	return b
}

// Store is the consumer-state store. It is safe for concurrent use.
type Store struct {
	cfg     Config
	owner   string
	slotSec int64
	pl      placements
	// legacyUntil is until when (Unix ms) look-ups read the old stores'
	// marks: 0 while not decided yet (they are read), -1 when there is
	// nothing to read (legacy.go).
	legacyUntil atomic.Int64
}

// New returns a Store; it loads the scripts, so it fails when Redis is
// unreachable within ctx.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg.setDefaults()
	// Lease, TTL and Buckets are dedup.*, which internal/config checked
	// when the configuration loaded; these two are the program's.
	switch {
	case cfg.Client == nil:
		return nil, errors.New("state: Client is required")
	case cfg.Slot < time.Second || cfg.Slot%time.Second != 0:
		return nil, fmt.Errorf("state: Slot must be a whole number of seconds, at least 1s, got %s", cfg.Slot)
	}
	for _, s := range []*redis.Script{acquireScript, renewScript, releaseScript, markScript, relayoutScript, claimScript} {
		if err := s.Load(ctx, cfg.Client).Err(); err != nil {
			return nil, fmt.Errorf("state: load scripts: %w", err)
		}
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	owner := cfg.Owner
	if owner == "" {
		owner = "kfpipe"
	}
	st := &Store{cfg: cfg, owner: owner + ":" + hex.EncodeToString(b), slotSec: int64(cfg.Slot / time.Second)}
	if cfg.Legacy.on() {
		go st.decideLegacy()
	}
	return st, nil
}

// Owner returns this store's owner id as written in ownership records.
func (s *Store) Owner() string { return s.owner }

// Item is one message: its idempotency key and WeChat's send_time (Unix
// seconds), both the same in every copy of the message. User (the
// external_userid) is read only to find the old leases store's marks.
type Item struct {
	Key      string
	SendTime int64
	User     string
}

// Digest is the 63-bit digest of an idempotency key stored as a mark.
func Digest(key string) int64 { return int64(xxhash.Sum64String(key) >> 1) }

// tag is the hash tag of a partition's keys.
func (s *Store) tag(topic string, partition int32) string {
	return s.cfg.KeyPrefix + "st:{" + topic + ":" + strconv.FormatInt(int64(partition), 10) + "}"
}

func (s *Store) ownKey(topic string, partition int32) string { return s.tag(topic, partition) + ":own" }

// layout is how a partition's marks are bucketed: a list of
// generations, each the bucket count of the send-time slots from its
// `from` on (up to the next generation's); slots before the first
// generation have the first's count. It is kept in the partition's
// ownership record (fields ly, the generations as "from:bk,…", and lyv,
// their version), set by the first owner from its configured Buckets and
// changed only by the partition's owner, from the observed rate
// (Marker), for slots after every slot already marked (the record's ms),
// so a mark already written — or written late into an earlier slot, under
// that slot's own generation — is found by owners and readers alike. A
// generation is dropped only when no mark written under it can still live
// (see relayoutScript). The old fields bk, bk0, bkfrom mirror the last
// two generations for binaries that read only those.
type layout struct {
	gens []gen
	ver  int64
}

// gen is one generation of a layout: bk buckets from slot from on.
type gen struct{ from, bk int64 }

// fixed is the layout of a partition with one bucket count throughout.
func fixed(buckets int) layout { return layout{gens: []gen{{0, int64(buckets)}}} }

// bucketsAt is the bucket count of slot.
func (ly layout) bucketsAt(slot int64) int64 {
	b := int64(1)
	if len(ly.gens) > 0 {
		b = ly.gens[0].bk
	}
	for _, g := range ly.gens[1:] {
		if slot < g.from {
			break
		}
		b = g.bk
	}
	return max(b, 1)
}

// layoutOf reads a layout from the record's ly and lyv values, or from
// the old fields bk, bk0, bkfrom of a record no owner of this version
// took yet (def when the record has neither: a partition no owner took
// yet).
func layoutOf(ly, ver, bk, bk0, from any, def int) layout {
	if s := toStr(ly); s != "" {
		out := layout{ver: toInt(ver)}
		for _, part := range strings.Split(s, ",") {
			f, b, ok := strings.Cut(part, ":")
			if !ok {
				continue
			}
			fi, _ := strconv.ParseInt(f, 10, 64)
			bi, _ := strconv.ParseInt(b, 10, 64)
			out.gens = append(out.gens, gen{fi, max(bi, 1)})
		}
		if len(out.gens) > 0 {
			return out
		}
	}
	b, b0, f := toInt(bk), toInt(bk0), toInt(from)
	if b < 1 {
		return fixed(def)
	}
	if b0 < 1 || b0 == b || f <= 0 {
		return fixed(int(b))
	}
	return layout{gens: []gen{{0, b0}, {f, b}}}
}

// slotOf is the send-time slot of sendTime (Unix seconds).
func (s *Store) slotOf(sendTime int64) int64 {
	if sendTime < 0 {
		return 0
	}
	return sendTime / s.slotSec
}

// bucketKey returns the bucket of a message of the partition.
func (s *Store) bucketKey(tag string, ly layout, sendTime, digest int64) string {
	slot := s.slotOf(sendTime)
	b := ly.bucketsAt(slot)
	return tag + ":d:" + strconv.FormatInt(slot, 10) + ":" + strconv.FormatInt(digest%b, 10)
}

// layout reads the partition's layout from its ownership record.
func (s *Store) layout(ctx context.Context, topic string, partition int32) (layout, error) {
	return readLayout(ctx, s.cfg.Client, s.ownKey(topic, partition), s.cfg.Buckets)
}

// layoutFields are the ownership record's fields layoutOf reads.
var layoutFields = []string{"ly", "lyv", "bk", "bk0", "bkfrom"}

// readLayout reads the layout in the ownership record key.
func readLayout(ctx context.Context, client redis.UniversalClient, key string, def int) (layout, error) {
	v, err := client.HMGet(ctx, key, layoutFields...).Result()
	if err != nil {
		return layout{}, fmt.Errorf("state: read the layout of %s: %w", key, err)
	}
	return layoutOf(v[0], v[1], v[2], v[3], v[4], def), nil
}

// Seen reports which items of the partition are done: Look without the
// distinction between Fresh and Held (a Held item is not done).
func (s *Store) Seen(ctx context.Context, topic string, partition int32, items []Item) ([]bool, error) {
	return done(s.Look(ctx, topic, partition, items))
}

// done turns look-up results into done or not.
func done(st []Status, err error) ([]bool, error) {
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(st))
	for i, v := range st {
		out[i] = v == Done
	}
	return out, nil
}

// Look reports what is recorded for each item of the partition: Done,
// Fresh, or (while Legacy is set) Held by an old store's owner. It needs
// no lease: a DLQ or an admin may ask too. It reads Redis every time,
// never a copy: one pipeline of SMISMEMBER, one per bucket, and with
// Legacy a second one for the items not found.
func (s *Store) Look(ctx context.Context, topic string, partition int32, items []Item) ([]Status, error) {
	ly, err := s.layout(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	return s.look(ctx, topic, partition, ly, items)
}

// look is Look with the partition's layout known.
func (s *Store) look(ctx context.Context, topic string, partition int32, ly layout, items []Item) ([]Status, error) {
	tag := s.tag(topic, partition)
	type q struct {
		idx     []int
		members []any
	}
	byKey := map[string]*q{}
	var order []string
	for i, it := range items {
		d := Digest(it.Key)
		k := s.bucketKey(tag, ly, it.SendTime, d)
		e := byKey[k]
		if e == nil {
			e = &q{}
			byKey[k] = e
			order = append(order, k)
		}
		e.idx = append(e.idx, i)
		e.members = append(e.members, d)
	}
	pipe := s.cfg.Client.Pipeline()
	cmds := make([]*redis.BoolSliceCmd, len(order))
	for j, k := range order {
		cmds[j] = pipe.SMIsMember(ctx, k, byKey[k].members...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("state: look up marks: %w", err)
	}
	out := make([]Status, len(items))
	for j, k := range order {
		for n, v := range cmds[j].Val() {
			if v {
				out[byKey[k].idx[n]] = Done
			}
		}
	}
	if err := s.lookMoved(ctx, topic, partition, items, out); err != nil {
		return nil, err
	}
	if s.legacyOn() {
		if err := s.legacyLook(ctx, items, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// scanAll lists the keys matching match: on a Redis Cluster on every
// master (a SCAN sees one node's keys), elsewhere with one SCAN.
func scanAll(ctx context.Context, client redis.UniversalClient, match string) ([]string, error) {
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
		return keys, err
	}
	return keys, scan(ctx, client)
}

// partitionTags lists the hash tags of every partition with an ownership
// record under keyPrefix.
func partitionTags(ctx context.Context, client redis.UniversalClient, keyPrefix string) ([]string, error) {
	owns, err := scanAll(ctx, client, keyPrefix+"st:{*}:own")
	if err != nil {
		return nil, fmt.Errorf("state: list partitions: %w", err)
	}
	tags := make([]string, len(owns))
	for i, k := range owns {
		tags[i] = k[:len(k)-len(":own")]
	}
	return tags, nil
}

// readLayouts reads the layout of each partition (by its tag): one
// pipeline of HMGET.
func readLayouts(ctx context.Context, client redis.UniversalClient, tags []string) ([]layout, error) {
	pipe := client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(tags))
	for i, tag := range tags {
		cmds[i] = pipe.HMGet(ctx, tag+":own", layoutFields...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("state: read the partitions' layouts: %w", err)
	}
	out := make([]layout, len(tags))
	for i, c := range cmds {
		v := c.Val()
		if len(v) < len(layoutFields) {
			out[i] = fixed(DefaultBuckets)
			continue
		}
		out[i] = layoutOf(v[0], v[1], v[2], v[3], v[4], DefaultBuckets)
	}
	return out, nil
}

// DoneAnywhere reports which items are marked done in any partition of
// any topic of the store under keyPrefix, with the default Slot and each
// partition's recorded bucket layout, for readers that know a message but not its partition (the
// admin, the DLQ's settling): one SCAN of the ownership records (on every master of a Redis Cluster), then one
// pipeline of SMISMEMBER per partition. A digest is 63 bits, so asking
// every partition adds a false "done" at a rate of partitions × 2⁻⁶³ per
// marked message.
func DoneAnywhere(ctx context.Context, client redis.UniversalClient, keyPrefix string, items []Item) ([]bool, error) {
	out := make([]bool, len(items))
	tags, err := partitionTags(ctx, client, keyPrefix)
	if err != nil || len(tags) == 0 || len(items) == 0 {
		return out, err
	}
	s := &Store{slotSec: int64(DefaultSlot / time.Second)}
	layouts, err := readLayouts(ctx, client, tags)
	if err != nil {
		return nil, err
	}
	return anyPartition(ctx, client, tags, items, "marks", func(pipe redis.Pipeliner, j int, tag string, it Item) *redis.BoolCmd {
		d := Digest(it.Key)
		return pipe.SIsMember(ctx, s.bucketKey(tag, layouts[j], it.SendTime, d), d)
	})
}

// anyPartition asks ask of every item (with a key) in every partition
// (tags), in one pipeline, and reports per item whether any answered true.
func anyPartition(ctx context.Context, client redis.UniversalClient, tags []string, items []Item, what string,
	ask func(pipe redis.Pipeliner, j int, tag string, it Item) *redis.BoolCmd) ([]bool, error) {
	out := make([]bool, len(items))
	pipe := client.Pipeline()
	type q struct {
		i   int
		cmd *redis.BoolCmd
	}
	var qs []q
	for i, it := range items {
		if it.Key == "" {
			continue
		}
		for j, tag := range tags {
			qs = append(qs, q{i, ask(pipe, j, tag, it)})
		}
	}
	if len(qs) == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("state: look up %s: %w", what, err)
	}
	for _, x := range qs {
		if x.cmd.Val() {
			out[x.i] = true
		}
	}
	return out, nil
}
