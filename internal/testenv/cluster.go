package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvRedisCluster is the variable scripts/services.sh exports with the
// test Redis Cluster's seed addresses (comma-separated).
const EnvRedisCluster = "KFPIPE_TEST_REDIS_CLUSTER"

// RedisClusterAddrs returns the seed addresses of the test Redis Cluster.
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(EnvRedisCluster)
	if v == "" {
		missing(t, "Redis Cluster", fmt.Errorf("%s not set", EnvRedisCluster))
	}
	addrs := strings.Split(v, ",")
	for _, a := range addrs {
		if err := reachable(a); err != nil {
			missing(t, "Redis Cluster node at "+a, err)
		}
	}
	return addrs
}

// RedisCluster returns a client on the test Redis Cluster and a fresh key
// prefix (ending in ':'); keys under the prefix are deleted from every
// master at cleanup. The cluster must say cluster_state:ok.
func RedisCluster(t testing.TB) (*redis.ClusterClient, string) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: RedisClusterAddrs(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = fmt.Errorf("cluster_state is not ok")
	}
	if err != nil {
		_ = c.Close()
		missing(t, "Redis Cluster", err)
	}
	prefix := Name(t, "rc") + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			iter := m.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				m.Del(ctx, iter.Val())
			}
			return nil
		})
		_ = c.Close()
	})
	return c, prefix
}

// EachRedis runs fn as two subtests: "single" on the test Redis and
// "cluster" on the test Redis Cluster, each with a fresh key prefix, so
// one test body covers both topologies.
func EachRedis(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient, prefix string)) {
	t.Helper()
	t.Run("single", func(t *testing.T) {
		rdb, prefix := Redis(t)
		fn(t, rdb, prefix)
	})
	t.Run("cluster", func(t *testing.T) {
		rdb, prefix := RedisCluster(t)
		fn(t, rdb, prefix)
	})
}
