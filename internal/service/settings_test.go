package service

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestStartUpSettingsLogged: each daemon's start-up line names the
// settings in force — the dedup store, its lease and the session timeout
// (how long a crashed consumer's users wait), the limiter's rule source and
// groups, the DLQ's retry timings, the sync timings — as loaded, so an
// operator reads them from the log instead of guessing at defaults.
func TestStartUpSettingsLogged(t *testing.T) {
	file := filepath.Join(testenv.RepoRoot(t), "config", "test.yaml")
	cc, err := config.LoadConsumer(file)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := config.LoadProducer(file)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := config.LoadDLQConsumer(file)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	logConsumerSettings(log.Named("consumer"), cc)
	logProducerSettings(log.Named("producer"), pc)
	logDLQSettings(log.Named("dlq"), dc)

	one := func(name string) map[string]any {
		t.Helper()
		var got []observer.LoggedEntry
		for _, e := range logs.FilterMessage(settingsMsg).All() {
			if e.LoggerName == name {
				got = append(got, e)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%s: %d %q lines, want 1", name, len(got), settingsMsg)
		}
		return got[0].ContextMap()
	}
	c := one("consumer")
	if c["dedup.lease"] != cc.Dedup.Lease ||
		c["kafka.consumer.session_timeout"] != cc.Kafka.Consumer.SessionTimeout || cc.Dedup.Lease == 0 {
		t.Errorf("consumer settings %v, want lease %s session %s", c, cc.Dedup.Lease,
			cc.Kafka.Consumer.SessionTimeout)
	}
	rl, _ := c["rate_limit"].(map[string]any)
	if rl["rules_backend"] != cc.RateLimit.RulesBackend || rl["groups"] != int64(len(cc.RateLimit.Groups)) ||
		!strings.Contains(rl["config_groups"].(string), "normal=") {
		t.Errorf("consumer rate_limit %v, want backend %s and %d groups", rl, cc.RateLimit.RulesBackend, len(cc.RateLimit.Groups))
	}
	p := one("producer")
	if p["sync.lock_ttl"] != pc.Sync.LockTTL || p["sync.safety_interval"] != pc.Sync.SafetyInterval ||
		p["sync.lock.backend"] != pc.Sync.Lock.Backend || pc.Sync.SafetyInterval < time.Second {
		t.Errorf("producer settings %v", p)
	}
	d := one("dlq")
	if d["recovery.base_delay"] != dc.Recovery.BaseDelay || d["recovery.max_delay"] != dc.Recovery.MaxDelay ||
		d["recovery.max_retries"] == "" {
		t.Errorf("dlq settings %v", d)
	}
}
