package service

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// testYAML is the configuration every service test starts from.
const testYAML = "../../config/test.yaml"

// place is a service test's place on the test services: fresh main and
// DLQ topic names (the topics are deleted at cleanup) and a fresh key
// prefix on the test Redis, or on the test Redis Cluster (then cc is set
// and every daemon configured by common uses it).
type place struct {
	rdb                 redis.UniversalClient
	cc                  *redis.ClusterClient
	prefix              string
	mainTopic, dlqTopic string
}

// newPlace makes a place on the test broker and the single test Redis.
func newPlace(t *testing.T) *place { return newPlaceOn(t, false) }

// newPlaceOn makes a place on the test broker and the test Redis Cluster
// (cluster) or the single test Redis.
func newPlaceOn(t *testing.T, cluster bool) *place {
	t.Helper()
	testenv.KafkaBrokers(t)
	p := &place{mainTopic: testenv.Name(t, "main"), dlqTopic: testenv.Name(t, "dlq")}
	if cluster {
		p.cc, p.prefix = testenv.RedisCluster(t)
		p.rdb = p.cc
	} else {
		p.rdb, p.prefix = testenv.Redis(t)
	}
	t.Cleanup(func() {
		// Read at cleanup: spreadTopic may have renamed the main topic.
		_, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{p.mainTopic, p.dlqTopic})
	})
	return p
}

// common points a daemon's shared settings at p: the broker, the topics,
// Redis (in cluster mode on the cluster), consumer group group and a
// free ops address.
func (p *place) common(t *testing.T, c *config.Common, group string) {
	t.Helper()
	c.Kafka.Brokers = testenv.KafkaBrokers(t)
	c.Kafka.Topics.Main.Name, c.Kafka.Topics.DLQ.Name = p.mainTopic, p.dlqTopic
	c.Kafka.Consumer.GroupID = group
	c.Redis.Addr = testenv.RedisAddr(t)
	c.Redis.KeyPrefix = p.prefix
	c.Ops.Addr = testenv.FreeAddr(t)
	if p.cc != nil {
		c.Redis.Mode = "cluster"
		c.Redis.ClusterAddrs = testenv.RedisClusterAddrs(t)
		c.Redis.DB = 0
	}
}

// load reads testYAML with a daemon's loader (config.LoadConsumer, …).
func load[C any](t *testing.T, loader func(path string) (C, error)) C {
	t.Helper()
	cfg, err := loader(testYAML)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// consumerConfig is the test schedule-consumer configuration at p, in a
// fresh consumer group, its emergency file in a temporary directory.
func (p *place) consumerConfig(t *testing.T) *config.Consumer {
	t.Helper()
	cfg := load(t, config.LoadConsumer)
	p.common(t, &cfg.Common, testenv.Name(t, "g"))
	cfg.DLQ.EmergencyFile = t.TempDir() + "/emergency.jsonl"
	return cfg
}

// dlqConfig is the test dlq-consumer configuration at p, in a fresh
// consumer group, its emergency file in a temporary directory and its
// admin API on a free address.
func (p *place) dlqConfig(t *testing.T) *config.DLQConsumer {
	t.Helper()
	cfg := load(t, config.LoadDLQConsumer)
	p.common(t, &cfg.Common, testenv.Name(t, "gdlq"))
	cfg.DLQ.EmergencyFile = t.TempDir() + "/emergency.jsonl"
	cfg.Admin.Addr = testenv.FreeAddr(t)
	return cfg
}

// producerConfig is the test kf-producer configuration at p, pulling the
// accounts kfIDs from fake, its callback on a free address.
func (p *place) producerConfig(t *testing.T, fake *wecomtest.Server, kfIDs ...string) *config.Producer {
	t.Helper()
	cfg := load(t, config.LoadProducer)
	p.common(t, &cfg.Common, "unused")
	cfg.WeCom.BaseURL = fake.URL()
	cfg.WeCom.OpenKfIDs = kfIDs
	cfg.Callback.Addr = testenv.FreeAddr(t)
	return cfg
}

// startBase starts the base of the daemon name (closed at cleanup).
func startBase(t *testing.T, ctx context.Context, name string, c config.Common) *daemon.Base {
	t.Helper()
	b, err := daemon.Start(ctx, name, c)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// startConsumer starts a schedule-consumer on cfg with handler h; the
// caller closes it. Its base is closed at cleanup.
func startConsumer(t *testing.T, ctx context.Context, cfg *config.Consumer, h handler.Handler) (*Consumer, *daemon.Base) {
	t.Helper()
	b := startBase(t, ctx, "schedule-consumer", cfg.Common)
	c, err := StartConsumer(ctx, cfg, b, h)
	if err != nil {
		t.Fatal(err)
	}
	return c, b
}

// startDLQ starts a dlq-consumer on cfg, closed at cleanup (an error of
// its Close fails the test).
func startDLQ(t *testing.T, ctx context.Context, cfg *config.DLQConsumer) *DLQ {
	t.Helper()
	d, err := StartDLQ(ctx, cfg, startBase(t, ctx, "dlq-consumer", cfg.Common))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
		defer c()
		if err := d.Close(sctx); err != nil {
			t.Errorf("dlq-consumer close: %v", err)
		}
	})
	return d
}

// pipeline is the three daemons of a deployment, run in this process.
type pipeline struct {
	prod *Producer
	cons *Consumer
	d    *DLQ
}

// startPipeline starts a schedule-consumer on ccfg with the handler
// handler makes from its base, a dlq-consumer on dcfg and a kf-producer on
// pcfg. The caller closes them (close). Their bases are closed at cleanup.
func startPipeline(t *testing.T, ctx context.Context, pcfg *config.Producer, ccfg *config.Consumer, dcfg *config.DLQConsumer,
	handler func(*daemon.Base) handler.Handler) pipeline {
	t.Helper()
	cbase := startBase(t, ctx, "schedule-consumer", ccfg.Common)
	var pl pipeline
	var err error
	if pl.cons, err = StartConsumer(ctx, ccfg, cbase, handler(cbase)); err != nil {
		t.Fatal(err)
	}
	if pl.d, err = StartDLQ(ctx, dcfg, startBase(t, ctx, "dlq-consumer", dcfg.Common)); err != nil {
		t.Fatal(err)
	}
	if pl.prod, err = StartProducer(ctx, pcfg, startBase(t, ctx, "kf-producer", pcfg.Common)); err != nil {
		t.Fatal(err)
	}
	return pl
}

// close closes the three daemons, producer first, within 20 s; an error
// fails the test.
func (pl pipeline) close(t *testing.T) {
	t.Helper()
	sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
	defer c()
	for _, err := range []error{pl.prod.Close(sctx), pl.cons.Close(sctx), pl.d.Close(sctx)} {
		if err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

// callbackSender signs callbacks to the pipeline's kf-producer as WeChat
// would.
func callbackSender(pl pipeline, pcfg *config.Producer) *wecomtest.CallbackSender {
	return &wecomtest.CallbackSender{URL: pl.prod.CallbackURL, Token: pcfg.Callback.Token,
		AESKey: pcfg.Callback.EncodingAESKey, CorpID: pcfg.WeCom.CorpID}
}
