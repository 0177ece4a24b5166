package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
)

// backends are the Kafka and Redis the demo runs against: embedded (the
// librdkafka mock cluster and miniredis, nothing to install) or real ones
// given by address, in which case every name gets a per-run suffix so
// repeated runs never see each other's topics, groups or keys.
type backends struct {
	brokers   string
	redisAddr string
	suffix    string // "" when embedded
	embedded  struct{ kafka, redis bool }

	mock *kafka.MockCluster
	mini *miniredis.Miniredis
	stop chan struct{}
	wg   sync.WaitGroup
}

// ttlTick is how often miniredis's TTLs advance.
const ttlTick = 50 * time.Millisecond

// tickTTLs makes miniredis's TTLs run on the wall clock, as locks, dedup
// leases and blocks do in Redis. miniredis's ClockTTL does the same but
// walks every key with a TTL on every command — thousands of dedup keys
// made that the demo's bottleneck — so time is advanced here in steps.
func (b *backends) tickTTLs() {
	defer b.wg.Done()
	t := time.NewTicker(ttlTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			b.mini.FastForward(now.Sub(last))
			last = now
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startBackends starts what is embedded. Topic names are those of topics
// (already suffixed for real brokers); the mock cluster gets them created
// up front, so daemon.Start's bootstrap finds them with the configured
// partition counts (see createMockTopics).
func startBackends(kafkaAddr, redisAddr string) (*backends, error) {
	b := &backends{brokers: kafkaAddr, redisAddr: redisAddr}
	if kafkaAddr != "" || redisAddr != "" {
		b.suffix = "demo-" + randHex(3)
	}
	if kafkaAddr == "" {
		var mc *kafka.MockCluster
		var err error
		withoutStderr(func() { mc, err = kafka.NewMockCluster(1) })
		if err != nil {
			return nil, fmt.Errorf("embedded kafka: %w", err)
		}
		b.mock, b.brokers, b.embedded.kafka = mc, mc.BootstrapServers(), true
	}
	if redisAddr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			b.close()
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		b.mini, b.redisAddr, b.embedded.redis = m, m.Addr(), true
		b.stop = make(chan struct{})
		b.wg.Add(1)
		go b.tickTTLs()
	}
	return b, nil
}

// createMockTopics creates the topics on the mock cluster. The mock
// answers the AdminClient's CreateTopics too, but creating them here
// keeps the demo independent of which admin APIs a librdkafka version's
// mock implements; daemon.Start's bootstrap then only checks them.
func (b *backends) createMockTopics(topics ...config.Topic) error {
	if b.mock == nil {
		return nil
	}
	for _, t := range topics {
		if err := b.mock.CreateTopic(t.Name, t.Partitions, 1); err != nil {
			return fmt.Errorf("embedded kafka: create topic %s: %w", t.Name, err)
		}
	}
	return nil
}

// cleanup removes what a run left on real services: its topics and its
// Redis keys. Embedded backends vanish with the process.
func (b *backends) cleanup(ctx context.Context, topics []string, keyPrefix string) error {
	var errs []error
	if !b.embedded.kafka && len(topics) > 0 {
		ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
		if err == nil {
			_, err = ac.DeleteTopics(ctx, topics, kafka.SetAdminOperationTimeout(10*time.Second))
			ac.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete demo topics: %w", err))
		}
	}
	if !b.embedded.redis && keyPrefix != "" {
		rdb := redis.NewClient(&redis.Options{Addr: b.redisAddr})
		iter := rdb.Scan(ctx, 0, keyPrefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 500 {
				errs = append(errs, rdb.Del(ctx, keys...).Err())
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			errs = append(errs, rdb.Del(ctx, keys...).Err())
		}
		errs = append(errs, iter.Err(), rdb.Close())
	}
	return errors.Join(errs...)
}

func (b *backends) close() {
	if b.stop != nil {
		close(b.stop)
		b.wg.Wait()
	}
	if b.mini != nil {
		b.mini.Close()
	}
	if b.mock != nil {
		b.mock.Close()
	}
}
