package redisconn

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func clusterConfig(t *testing.T) config.Redis {
	return config.Redis{Mode: "cluster", ClusterAddrs: testenv.RedisClusterAddrs(t), PoolSize: 4,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}
}

// redis.mode cluster gives a ClusterClient that follows the slot map, and
// Tag puts a group's keys in one slot there (a script over them runs)
// while leaving single-node keys as they were.
func TestClusterMode(t *testing.T) {
	c := New(clusterConfig(t))
	defer c.Close()
	if !IsCluster(c) {
		t.Fatalf("cluster mode gave %T, want *redis.ClusterClient", c)
	}
	ctx := context.Background()
	if err := Ping(c)(ctx); err != nil {
		t.Fatal(err)
	}
	_, prefix := testenv.RedisCluster(t)
	if got := Tag(c, "dlq"); got != "{dlq}" {
		t.Errorf("Tag on a cluster = %q", got)
	}
	single := New(config.Redis{Mode: "single", Addr: "127.0.0.1:1"})
	defer single.Close()
	if got := Tag(single, "dlq"); got != "dlq" {
		t.Errorf("Tag on a single node = %q, want the name unchanged (live keys keep their names)", got)
	}
	// Two keys of one tag: one script writes both. Untagged, the same
	// script is refused (the test would pass without Tag otherwise).
	script := redis.NewScript(`redis.call('SET', KEYS[1], 'a') redis.call('SET', KEYS[2], 'b') return 1`)
	a, b := prefix+Tag(c, "g")+":a", prefix+Tag(c, "g")+":b"
	if err := script.Run(ctx, c, []string{a, b}).Err(); err != nil {
		t.Fatalf("script over one tag's keys: %v", err)
	}
	if err := script.Run(ctx, c, []string{prefix + "x:a", prefix + "x:b2"}).Err(); err == nil && Slot(prefix+"x:a") != Slot(prefix+"x:b2") {
		t.Fatal("a script over two slots ran: the cluster is not checking slots")
	}
	// Slot agrees with the server's CLUSTER KEYSLOT.
	for _, k := range []string{a, prefix + "plain", "{user-1}:x", "x{}y", "{}", "a{b}c{d}"} {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, server says %d", k, got, want)
		}
	}
	// ScanKeys sees keys on every master.
	var want []string
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("%sscan:%d", prefix, i)
		want = append(want, k)
		if err := c.Set(ctx, k, 1, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := ScanKeys(ctx, c, prefix+"scan:*", 10, func(keys []string) error { got = append(got, keys...); return nil }); err != nil {
		t.Fatal(err)
	}
	sort.Strings(got)
	sort.Strings(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ScanKeys found %d keys, want %d", len(got), len(want))
	}
	// The eviction check reads every node.
	if p, err := CheckEvictionPolicy(ctx, c); err != nil || p != "noeviction" {
		t.Fatalf("eviction policy on the cluster: %q, %v", p, err)
	}
}
