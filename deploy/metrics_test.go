package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// nameTaken reports whether reg has a collector with the fully-qualified
// name. A registry cannot list its descriptors, and Gather omits a vector
// without children, so it is asked directly: registering a gauge of that
// name with a help text nobody uses fails exactly when the name is already
// registered (any type, any labels: the registry insists that one name has
// one help string and one label set), and succeeds — after which the probe
// is unregistered — when it is not.
func nameTaken(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "deploy test probe for " + name})
	err := reg.Register(probe)
	if err == nil {
		reg.Unregister(probe)
		return false
	}
	if !strings.Contains(err.Error(), "same fully-qualified name") {
		t.Fatalf("probe %s: %v", name, err)
	}
	return true
}

// startDaemons runs the three daemons in-process, wired exactly as the
// mains wire them (daemon.Start + service.Start…), against the test Kafka
// and Redis with fresh topics, group and key prefix, and returns their
// registries by daemon name.
func startDaemons(t *testing.T) map[string]*prometheus.Registry {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	_, prefix := testenv.Redis(t)
	mainTopic, dlqTopic := testenv.Name(t, "main"), testenv.Name(t, "dlq")
	cfgFile := repo(t, "config", "test.yaml")
	dir := t.TempDir()

	common := func(c *config.Common, group string) {
		c.Log.Level = "error"
		c.Ops.Addr = "127.0.0.1:0"
		c.Kafka.Brokers = brokers
		c.Kafka.Topics.Main.Name, c.Kafka.Topics.DLQ.Name = mainTopic, dlqTopic
		c.Kafka.Consumer.GroupID = testenv.Name(t, group)
		c.Redis.Mode, c.Redis.Addr, c.Redis.KeyPrefix = "single", redisAddr, prefix
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	regs := map[string]*prometheus.Registry{}
	var closers []func(context.Context) error
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](cctx); err != nil {
				t.Logf("close: %v", err)
			}
		}
		ac := testenv.Admin(t)
		_, _ = ac.DeleteTopics(cctx, []string{mainTopic, dlqTopic})
	})
	start := func(name string, c config.Common, svc func(*daemon.Base) (func(context.Context) error, error)) {
		base, err := daemon.Start(ctx, name, c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		closers = append(closers, base.Close)
		closeSvc, err := svc(base)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		closers = append(closers, closeSvc)
		regs[name] = base.Registry
	}

	pc, err := config.LoadProducer(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	common(&pc.Common, "producer")
	pc.Callback.Addr = "127.0.0.1:0"
	start("kf-producer", pc.Common, func(b *daemon.Base) (func(context.Context) error, error) {
		s, err := service.StartProducer(ctx, pc, b)
		if err != nil {
			return nil, err
		}
		return s.Close, nil
	})

	cc, err := config.LoadConsumer(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	common(&cc.Common, "consumer")
	cc.DLQ.EmergencyFile = filepath.Join(dir, "consumer", "emergency.jsonl")
	start("schedule-consumer", cc.Common, func(b *daemon.Base) (func(context.Context) error, error) {
		s, err := service.StartConsumer(ctx, cc, b, nil)
		if err != nil {
			return nil, err
		}
		return s.Close, nil
	})

	dc, err := config.LoadDLQConsumer(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	common(&dc.Common, "dlq")
	dc.DLQ.EmergencyFile = filepath.Join(dir, "dlq", "emergency.jsonl")
	dc.Admin.Addr = "127.0.0.1:0"
	start("dlq-consumer", dc.Common, func(b *daemon.Base) (func(context.Context) error, error) {
		s, err := service.StartDLQ(ctx, dc, b)
		if err != nil {
			return nil, err
		}
		return s.Close, nil
	})
	return regs
}

// TestMonitoredMetricsAreExported: every kfpipe_ metric an alert or a
// dashboard panel names is registered by at least one of the running
// daemons. A misspelt or removed metric would make an alert silently never
// fire; here it fails the test.
func TestMonitoredMetricsAreExported(t *testing.T) {
	t.Parallel()
	used := usedMetrics(t)
	regs := startDaemons(t)

	// The probe must be able to say no, and yes.
	for name, reg := range regs {
		if nameTaken(t, reg, "kfpipe_deploy_test_no_such_metric") {
			t.Fatalf("%s: the probe reports a metric nobody registered", name)
		}
		if !nameTaken(t, reg, "kfpipe_build_info") {
			t.Fatalf("%s: the probe misses kfpipe_build_info", name)
		}
	}

	exportedBy := func(name string) []string {
		var by []string
		for _, d := range daemons {
			if nameTaken(t, regs[d], name) {
				by = append(by, d)
			}
		}
		return by
	}
	// Histogram series: kfpipe_x_bucket etc. are exported when kfpipe_x is a
	// histogram, which Gather tells (the histograms here have no labels, so
	// Gather always lists them).
	histograms := map[string]bool{}
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetType().String() == "HISTOGRAM" {
				histograms[mf.GetName()] = true
			}
		}
	}
	for _, name := range sortedNames(used) {
		if by := exportedBy(name); len(by) > 0 {
			t.Logf("%s: exported by %s", name, strings.Join(by, ", "))
			continue
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if base != name && histograms[base] {
			t.Logf("%s: series of the histogram %s", name, base)
			continue
		}
		t.Errorf("%s is used by %s but no daemon exports it", name, strings.Join(used[name], ", "))
	}
}
