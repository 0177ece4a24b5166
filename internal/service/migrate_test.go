package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// clusterName is the name a key of a single Redis or Sentinel takes on a
// Redis Cluster (docs/operations.md, "Migrating a running deployment"):
// the part after the key prefix is renamed where the Cluster tags it.
func clusterName(rest string) string {
	switch {
	case strings.HasPrefix(rest, "cursor:"):
		return "cursor:{" + strings.TrimPrefix(rest, "cursor:") + "}"
	case strings.HasPrefix(rest, "rl:"):
		return "{rl}:" + strings.TrimPrefix(rest, "rl:")
	case strings.HasPrefix(rest, "dlq:"):
		return "{dlq}:" + strings.TrimPrefix(rest, "dlq:")
	case strings.HasPrefix(rest, "lock:"):
		return "" // locks are not copied: they expire
	}
	return rest // the consumer state (st:{topic:partition}:…) and the rest keep their names
}

// copyToCluster is step 3 of the migration: every key under fromPrefix on
// the old Redis, with its TTL, DUMPed there and RESTOREd on the Cluster
// under toPrefix and its cluster name. It returns the keys copied.
func copyToCluster(ctx context.Context, from redis.UniversalClient, fromPrefix string, to *redis.ClusterClient, toPrefix string) (int, error) {
	n := 0
	err := redisconn.ScanKeys(ctx, from, fromPrefix+"*", 500, func(keys []string) error {
		for _, k := range keys {
			name := clusterName(strings.TrimPrefix(k, fromPrefix))
			if name == "" {
				continue
			}
			dump, err := from.Dump(ctx, k).Result()
			if err == redis.Nil {
				continue // expired meanwhile
			}
			if err != nil {
				return fmt.Errorf("dump %s: %w", k, err)
			}
			ttl, err := from.PTTL(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("pttl %s: %w", k, err)
			}
			if ttl < 0 {
				ttl = 0 // no expiry
			}
			if err := to.RestoreReplace(ctx, toPrefix+name, ttl, dump).Err(); err != nil {
				return fmt.Errorf("restore %s as %s: %w", k, toPrefix+name, err)
			}
			n++
		}
		return nil
	})
	return n, err
}

// TestMigrateSingleToCluster runs the documented migration from a single
// Redis holding live state: a consumer's done marks and ownership records
// (two partitions), dead letters in the DLQ index and a sync cursor are
// copied to the Redis Cluster; then a consumer's store on the Cluster
// recognizes the marks (and takes the partitions with a larger fencing
// token and the old high-water), the index on the Cluster lists the
// letters, and the cursor reads back under its cluster name.
func TestMigrateSingleToCluster(t *testing.T) {
	single, oldPrefix := testenv.Redis(t)
	cluster, newPrefix := testenv.RedisCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "qywx-chat-messages"
	now := time.Now()

	// The live state on the single Redis.
	old, err := state.New(ctx, state.Config{Client: single, KeyPrefix: oldPrefix, Owner: "old", TTL: 169 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := map[int32][]state.Item{}
	tokens, hws := map[int32]int64{}, map[int32]int64{}
	for p := int32(0); p < 2; p++ {
		l, err := old.Acquire(ctx, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			done[p] = append(done[p], state.Item{Key: fmt.Sprintf("wk:msg-%d-%d", p, i), SendTime: now.Unix() - int64(i*7)})
		}
		hws[p] = 49 + int64(p)
		if err := l.Mark(ctx, hws[p], done[p]); err != nil {
			t.Fatal(err)
		}
		tokens[p] = l.Token()
		if err := l.Release(ctx); err != nil { // the consumers were stopped
			t.Fatal(err)
		}
	}
	oldIdx := dlq.NewIndex(single, oldPrefix)
	for i := range 6 {
		user := fmt.Sprintf("wm-user-%d", i%3)
		dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: topic, Partition: 1, Offset: int64(100 + i), Timestamp: now, Key: []byte(user),
			Value: []byte(fmt.Sprintf(`{"msgid":"m-%d","external_userid":%q,"open_kfid":"wk","msgtype":"text","send_time":%d,"text":{"content":"hi"}}`,
				i, user, now.Unix()))}, dlq.ReasonDownstreamError, "migration test", now)
		if _, err := oldIdx.Index(ctx, dl, dlq.Coord{Partition: 0, Offset: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	oldStats, err := oldIdx.Stats(ctx)
	if err != nil || oldStats.Total != 6 {
		t.Fatalf("index on the single Redis: %+v %v, want 6 letters", oldStats, err)
	}
	if err := single.Set(ctx, oldPrefix+"cursor:wk", "cursor-42", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// Step 3: the copy.
	n, err := copyToCluster(ctx, single, oldPrefix, cluster, newPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copied %d keys", n)

	// Step 4: the daemons on the Cluster.
	store, err := state.New(ctx, state.Config{Client: cluster, KeyPrefix: newPrefix, Owner: "new", TTL: 169 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 2; p++ {
		fresh := state.Item{Key: fmt.Sprintf("wk:never-%d", p), SendTime: now.Unix()}
		seen, err := store.Seen(ctx, topic, p, append(append([]state.Item{}, done[p]...), fresh))
		if err != nil {
			t.Fatal(err)
		}
		for i, it := range done[p] {
			if !seen[i] {
				t.Errorf("partition %d: %s done on the single Redis, not done on the Cluster", p, it.Key)
			}
		}
		if seen[len(seen)-1] {
			t.Errorf("partition %d: a message never handled is done on the Cluster", p)
		}
		l, err := store.Acquire(ctx, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= tokens[p] || l.PrevHW() != hws[p] {
			t.Errorf("partition %d on the Cluster: token %d (old %d), prev high-water %d (want %d)",
				p, l.Token(), tokens[p], l.PrevHW(), hws[p])
		}
		_ = l.Release(ctx)
	}
	found, err := state.DoneAnywhere(ctx, cluster, newPrefix, done[1][:3])
	if err != nil || len(found) != 3 || !found[0] || !found[1] || !found[2] {
		t.Errorf("DoneAnywhere on the Cluster = %v %v, want all three", found, err)
	}
	idx := dlq.NewIndex(cluster, newPrefix)
	st, err := idx.Stats(ctx)
	if err != nil || st.Total != oldStats.Total || st.Due != oldStats.Due || st.ByReason["downstream_error"] != 6 {
		t.Errorf("index on the Cluster: %+v %v, want %+v", st, err, oldStats)
	}
	es, _, err := idx.List(ctx, dlq.Filter{User: "wm-user-1"})
	if err != nil || len(es) != 2 {
		t.Errorf("letters of wm-user-1 on the Cluster: %d %v, want 2", len(es), err)
	}
	if v, err := cluster.Get(ctx, newPrefix+"cursor:"+redisconn.Tag(cluster, "wk")).Result(); err != nil || v != "cursor-42" {
		t.Errorf("cursor on the Cluster = %q %v, want cursor-42", v, err)
	}
}
