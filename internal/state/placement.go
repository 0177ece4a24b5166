package state

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/kafkaclient/keyhash"
)

// Partition counts (issue 43, item 6). Marks are kept by the partition a
// message was read from, and Kafka puts a user's messages in
// murmur2(external_userid) mod the topic's partition count: when
// partitions are added, most users move, and a copy of a message (a
// re-pull, a re-injected letter) lands in a partition that holds no mark
// of it. So the store records, per topic, every partition count it was
// read under (when it was first seen), and a look-up that finds nothing
// in the message's partition also asks the partition the user had under
// every other recorded count, for as long as marks written under that
// count may live: until the next count was first seen, plus the backlog
// the old placement may still hold (bounded by the topic's retention,
// itself below the TTL) and the marks' TTL — two TTLs in all.
//
// The history is one small hash per topic, <prefix>st:{<topic>}:np,
// field count → Unix seconds first seen. It is written at each
// acquisition (Config.Partitions tells the count) and read by look-ups
// at most every historyRefresh.

// historyRefresh is how long a store reuses a topic's count history.
const historyRefresh = 10 * time.Second

// countsKey is the key of a topic's partition-count history.
func (s *Store) countsKey(topic string) string {
	return s.cfg.KeyPrefix + "st:{" + topic + "}:np"
}

// recordCountScript: ARGV count. Records when a count was first seen
// (Redis's clock); returns 1 when it is new.
var recordCountScript = redis.NewScript(`
local t = redis.call('TIME')
return redis.call('HSETNX', KEYS[1], ARGV[1], t[1])
`)

// countEntry is one recorded partition count.
type countEntry struct {
	n     int
	first int64 // Unix seconds
}

// history is a topic's recorded counts, oldest first, as last read.
type history struct {
	at     time.Time
	counts []countEntry
}

// placements keeps the count histories a store read, by topic.
type placements struct {
	mu     sync.Mutex
	topics map[string]history
}

// RecordPartitions records that topic is read with n partitions (a
// consumer calls it when it learns the count; Acquire does when
// Config.Partitions is set).
func (s *Store) RecordPartitions(ctx context.Context, topic string, n int) error {
	if n < 1 {
		return nil
	}
	added, err := recordCountScript.Run(ctx, s.cfg.Client, []string{s.countsKey(topic)}, n).Int64()
	if err != nil {
		return fmt.Errorf("state: record the partition count of %s: %w", topic, err)
	}
	if added == 1 {
		s.pl.mu.Lock()
		delete(s.pl.topics, topic) // read it again
		s.pl.mu.Unlock()
	}
	return nil
}

// recordCount records topic's count at an acquisition of partition p: at
// least p+1, whatever a stale metadata answer says.
func (s *Store) recordCount(ctx context.Context, topic string, p int32) error {
	if s.cfg.Partitions == nil {
		return nil
	}
	n, err := s.cfg.Partitions(ctx, topic)
	if err != nil {
		return fmt.Errorf("state: the partition count of %s: %w", topic, err)
	}
	return s.RecordPartitions(ctx, topic, max(n, int(p)+1))
}

// countHistory returns topic's recorded partition counts, oldest first;
// it reads them at most every historyRefresh.
func (s *Store) countHistory(ctx context.Context, topic string) ([]countEntry, error) {
	s.pl.mu.Lock()
	h, ok := s.pl.topics[topic]
	s.pl.mu.Unlock()
	if ok && time.Since(h.at) < historyRefresh {
		return h.counts, nil
	}
	m, err := s.cfg.Client.HGetAll(ctx, s.countsKey(topic)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("state: read the partition counts of %s: %w", topic, err)
	}
	h = history{at: time.Now()}
	for k, v := range m {
		n, err1 := strconv.Atoi(k)
		first, err2 := strconv.ParseInt(v, 10, 64)
		if err1 == nil && err2 == nil && n > 0 {
			h.counts = append(h.counts, countEntry{n, first})
		}
	}
	sort.Slice(h.counts, func(i, j int) bool {
		if h.counts[i].first != h.counts[j].first {
			return h.counts[i].first < h.counts[j].first
		}
		return h.counts[i].n < h.counts[j].n
	})
	s.pl.mu.Lock()
	if s.pl.topics == nil {
		s.pl.topics = map[string]history{}
	}
	s.pl.topics[topic] = h
	s.pl.mu.Unlock()
	return h.counts, nil
}

// liveCounts are the counts of h whose placement may still hold live
// marks at now: the newest, and each older one until two TTLs after the
// next was first seen.
func (s *Store) liveCounts(h []countEntry, now time.Time) []int {
	var out []int
	keep := int64(2 * s.cfg.TTL / time.Second)
	for i, e := range h {
		if i == len(h)-1 || now.Unix() < h[i+1].first+keep {
			out = append(out, e.n)
		}
	}
	return out
}

// lookMoved looks the items of topic/partition not found (out not Done)
// up in the partitions their users had under the topic's other recorded
// partition counts: one pipeline of the layouts, one of SMISMEMBER.
// Nothing is asked while the topic has had one count.
func (s *Store) lookMoved(ctx context.Context, topic string, partition int32, items []Item, out []Status) error {
	if len(items) == 0 {
		return nil
	}
	h, err := s.countHistory(ctx, topic)
	if err != nil || len(h) < 2 {
		return err
	}
	counts := s.liveCounts(h, time.Now())
	if len(counts) < 2 {
		return nil
	}
	// Which items to ask where.
	type ask struct {
		idx   []int
		items []Item
	}
	where := map[int32]*ask{}
	var parts []int32
	for i, it := range items {
		if out[i] == Done || it.User == "" {
			continue
		}
		seen := map[int32]bool{partition: true}
		for _, n := range counts {
			p := KeyPartition(it.User, n)
			if seen[p] {
				continue
			}
			seen[p] = true
			a := where[p]
			if a == nil {
				a = &ask{}
				where[p] = a
				parts = append(parts, p)
			}
			a.idx = append(a.idx, i)
			a.items = append(a.items, it)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	layouts := make([]layout, len(parts))
	pipe := s.cfg.Client.Pipeline()
	lcmds := make([]*redis.SliceCmd, len(parts))
	for j, p := range parts {
		lcmds[j] = pipe.HMGet(ctx, s.ownKey(topic, p), layoutFields...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("state: read the layouts of moved users' partitions: %w", err)
	}
	for j, c := range lcmds {
		v := c.Val()
		if len(v) < len(layoutFields) {
			layouts[j] = fixed(s.cfg.Buckets)
			continue
		}
		layouts[j] = layoutOf(v[0], v[1], v[2], v[3], v[4], s.cfg.Buckets)
	}
	pipe = s.cfg.Client.Pipeline()
	type q struct {
		i   int
		cmd *redis.BoolCmd
	}
	var qs []q
	for j, p := range parts {
		tag := s.tag(topic, p)
		for n, it := range where[p].items {
			d := Digest(it.Key)
			qs = append(qs, q{where[p].idx[n], pipe.SIsMember(ctx, s.bucketKey(tag, layouts[j], it.SendTime, d), d)})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("state: look up marks in moved users' partitions: %w", err)
	}
	for _, x := range qs {
		if x.cmd.Val() {
			out[x.i] = Done
		}
	}
	return nil
}

// KeyPartition is the partition Kafka's murmur2 partitioner (the
// producer's murmur2_random, as the Java client) puts a non-empty key in
// among partitions: the one internal/kafkaclient uses (package keyhash).
func KeyPartition(key string, partitions int) int32 { return keyhash.Partition(key, partitions) }

// recordCountAtScript: ARGV count. Records when a count was first seen
// (Redis's clock) and returns that time, Redis's time now (in seconds) and
// how many counts the topic has had.
var recordCountAtScript = redis.NewScript(`
local t = redis.call('TIME')
redis.call('HSETNX', KEYS[1], ARGV[1], t[1])
return {tonumber(redis.call('HGET', KEYS[1], ARGV[1])), tonumber(t[1]), redis.call('HLEN', KEYS[1])}
`)

// RecordPartitionCount records that topic's messages are placed by n
// partitions (every daemon calls it at start with its configured count,
// before it reads or writes the topic) and returns how long the caller
// must wait before placing or reading any message under that count: until
// every store's cached count history (read at most historyRefresh ago)
// holds it. Without the wait, a copy of a message (a re-pull, a
// re-injected letter) placed under a new count reaches a consumer whose
// history still shows only the old count, which then never asks the
// partition the user had, and the copy takes effect again. The wait is
// zero once the count was first seen that long ago, and for a topic's
// first count (no user has moved): a partition change costs each daemon
// started in the ~11 s after it the rest of them.
func RecordPartitionCount(ctx context.Context, client redis.UniversalClient, keyPrefix, topic string, n int) (time.Duration, error) {
	if n < 1 {
		return 0, nil
	}
	key := keyPrefix + "st:{" + topic + "}:np"
	v, err := recordCountAtScript.Run(ctx, client, []string{key}, n).Int64Slice()
	if err != nil || len(v) != 3 {
		return 0, fmt.Errorf("state: record the partition count of %s: %v %w", topic, v, err)
	}
	if v[2] < 2 {
		return 0, nil
	}
	// first is whole seconds: the count was seen up to 1 s after it.
	known := time.Duration(v[0]-v[1])*time.Second + historyRefresh + time.Second
	return max(0, known), nil
}
