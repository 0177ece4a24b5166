package hostile_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// env is kf-producer and dlq-consumer running in-process on the test
// services, with a fake WeChat behind the producer.
type env struct {
	pcfg  *config.Producer
	dcfg  *config.DLQConsumer
	pbase *daemon.Base
	dbase *daemon.Base
	prod  *service.Producer
	dlq   *service.DLQ
	fake  *wecomtest.Server
	rdb   *redis.Client
	// dprefix is the dlq-consumer's key prefix: the admin API's state
	// (DLQ index, rate-limit blocks and groups, audit stream).
	dprefix string

	client   *http.Client // never follows redirects: a redirect is an answer
	sent     atomic.Int64
	status5x atomic.Int64
}

func startEnv(t *testing.T) *env {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	rdb, pprefix := testenv.Redis(t)
	_, dprefix := testenv.Redis(t) // a second prefix, cleaned up too
	root := testenv.RepoRoot(t)
	path := filepath.Join(root, "config", "test.yaml")

	pcfg, err := config.LoadProducer(path)
	if err != nil {
		t.Fatal(err)
	}
	dcfg, err := config.LoadDLQConsumer(path)
	if err != nil {
		t.Fatal(err)
	}
	mainTopic, dlqTopic := testenv.Name(t, "main"), testenv.Name(t, "dlq")
	for _, c := range []*config.Common{&pcfg.Common, &dcfg.Common} {
		c.Kafka.Brokers = brokers
		c.Kafka.Topics.Main.Name, c.Kafka.Topics.DLQ.Name = mainTopic, dlqTopic
		c.Redis.Addr = redisAddr
		c.Ops.Addr = "127.0.0.1:0"
		// Thousands of refused requests each log a warning; the test
		// asserts on metrics and answers instead.
		c.Log.Level = "error"
	}
	// Created here (with the configured partitions, so bootstrap accepts
	// them) so that they are deleted at cleanup.
	testenv.CreateTopic(t, mainTopic, pcfg.Kafka.Topics.Main.Partitions)
	testenv.CreateTopic(t, dlqTopic, pcfg.Kafka.Topics.DLQ.Partitions)
	pcfg.Redis.KeyPrefix, dcfg.Redis.KeyPrefix = pprefix, dprefix
	pcfg.Callback.Addr, dcfg.Admin.Addr = "127.0.0.1:0", "127.0.0.1:0"
	dcfg.Kafka.Consumer.GroupID = testenv.Name(t, "dlqgrp")
	dcfg.DLQ.EmergencyFile = filepath.Join(t.TempDir(), "dlq-emergency.jsonl")
	// Seeded dead letters must stay where they are while the test runs.
	dcfg.Recovery.BaseDelay, dcfg.Recovery.MaxDelay = time.Hour, 2*time.Hour

	fake := wecomtest.New(wecomtest.Options{CorpID: pcfg.WeCom.CorpID, Secret: pcfg.WeCom.Secret})
	t.Cleanup(fake.Close)
	pcfg.WeCom.BaseURL = fake.URL()
	// No safety sync: sync_msg calls come from callbacks. Accounts are
	// discovered (no open_kfids), and a discovered account gets safety
	// syncs too, so the interval is longer than the test.
	pcfg.WeCom.OpenKfIDs = nil
	pcfg.Sync.SafetyInterval = time.Hour

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := &env{pcfg: pcfg, dcfg: dcfg, fake: fake, rdb: rdb, dprefix: dprefix,
		client: &http.Client{Timeout: 15 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if e.pbase, err = daemon.Start(ctx, "kf-producer", pcfg.Common); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.pbase.Close(context.Background()) })
	if e.prod, err = service.StartProducer(ctx, pcfg, e.pbase); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.prod.Close(c); err != nil {
			t.Errorf("producer close: %v", err)
		}
	})
	if e.dbase, err = daemon.Start(ctx, "dlq-consumer", dcfg.Common); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.dbase.Close(context.Background()) })
	if e.dlq, err = service.StartDLQ(ctx, dcfg, e.dbase); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.dlq.Close(c); err != nil {
			t.Errorf("dlq close: %v", err)
		}
	})
	return e
}

// hreq is a request kept as data, so it can be replayed and mutated.
type hreq struct {
	method string
	url    string // absolute
	header http.Header
	body   []byte
	// chunked sends the body without Content-Length.
	chunked bool
}

func (r hreq) clone() hreq {
	c := r
	c.header = r.header.Clone()
	if c.header == nil {
		c.header = http.Header{}
	}
	c.body = bytes.Clone(r.body)
	return c
}

// do sends r and returns the status and body; a transport error fails
// the test.
func (e *env) do(t *testing.T, r hreq) (int, []byte) {
	t.Helper()
	code, b, err := e.try(r)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.url, err)
	}
	return code, b
}

// try sends r; an error is a transport error (nothing was answered).
func (e *env) try(r hreq) (int, []byte, error) {
	var body io.Reader = bytes.NewReader(r.body)
	if r.chunked {
		body = io.MultiReader(bytes.NewReader(r.body)) // hides the length
	}
	req, err := http.NewRequest(r.method, r.url, body)
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if r.chunked {
		req.ContentLength = -1
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e.count(resp.StatusCode)
	return resp.StatusCode, b, nil
}

func (e *env) count(code int) {
	e.sent.Add(1)
	if code >= 500 {
		e.status5x.Add(1)
	}
}

// raw writes a request byte for byte (paths and headers no client would
// send) and returns the status line's code; the caller counts it.
func (e *env) raw(t *testing.T, addr, request string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatalf("raw write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("raw %q: %v", firstLine(request), err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\r'); i >= 0 {
		return s[:i]
	}
	return s
}

// counterSum adds up every series of the counter name in reg, optionally
// only those with label=value.
func counterSum(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	var labels []string
	if label != "" {
		labels = []string{label, value}
	}
	v, _ := testenv.Gathered(t, reg, name, labels...)
	return v
}

// snapshot is the admin API's state in Redis: every key under the
// dlq-consumer's prefix (but the scheduler's lock, which it renews on its
// own) with its serialized value.
func (e *env) snapshot(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := e.rdb.Scan(ctx, 0, e.dprefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if strings.HasPrefix(k, e.dprefix+"lock:") {
			continue
		}
		v, err := e.rdb.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// diff lists the keys whose value differs between two snapshots.
func diff(a, b map[string]string) []string {
	var keys []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			keys = append(keys, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func (e *env) auditLen(t *testing.T) int64 {
	t.Helper()
	n, err := e.rdb.XLen(context.Background(), e.dprefix+"audit").Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

// seedDLQ sends dead letters through the DLQ topic and waits until the
// dlq-consumer indexed them, so the admin API has something to change.
func (e *env) seedDLQ(t *testing.T, letters []*chatmsg.DeadLetter) {
	t.Helper()
	// The seeder is a producer of its own: its own emergency file (the
	// dlq-consumer's is locked by the dlq-consumer).
	seed := e.dcfg.DLQ
	seed.EmergencyFile = filepath.Join(t.TempDir(), "seed-emergency.jsonl")
	p, err := dlq.NewProducer(dlq.ProducerConfig{Kafka: e.dcfg.Kafka, DLQ: seed})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, len(letters))
	for _, dl := range letters {
		p.Send(dl, func(err error) { errs <- err })
	}
	for range letters {
		if err := <-errs; err != nil {
			t.Fatalf("seed dead letter: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := e.dlq.Index.Stats(ctx)
		if err == nil && st.Total == int64(len(letters)) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("dead letters not indexed: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mainTopicRecords reads the main topic from the start until want records
// arrived (then a short quiet period, to see duplicates) or the deadline.
func (e *env) mainTopicRecords(t *testing.T, want int) []*chatmsg.ChatMessage {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": e.pcfg.Kafka.Brokers,
		"group.id": testenv.Name(t, "verify"), "auto.offset.reset": "earliest", "enable.auto.commit": false,
		"isolation.level": "read_committed"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(e.pcfg.Kafka.Topics.Main.Name, nil); err != nil {
		t.Fatal(err)
	}
	var out []*chatmsg.ChatMessage
	deadline := time.Now().Add(30 * time.Second)
	var quietUntil time.Time
	for time.Now().Before(deadline) {
		if len(out) >= want {
			if quietUntil.IsZero() {
				quietUntil = time.Now().Add(time.Second)
			}
			if time.Now().After(quietUntil) {
				break
			}
		}
		m, err := c.ReadMessage(200 * time.Millisecond)
		if err != nil {
			if ke, ok := err.(kafka.Error); ok && ke.IsTimeout() {
				continue
			}
			t.Fatalf("read main topic: %v", err)
		}
		cm, err := chatmsg.Decode(m.Value)
		if err != nil {
			t.Fatalf("main topic record %s: %v", m.TopicPartition, err)
		}
		out = append(out, cm)
	}
	return out
}

// checkDelivery compares what reached Kafka with what the fake WeChat
// holds: each upstream message once, per user in the fake's order.
func checkDelivery(want map[string][]string, got []*chatmsg.ChatMessage) (lost, dup, reordered int, detail string) {
	seen := map[string]int{}
	byUser := map[string][]string{}
	for _, m := range got {
		seen[m.UpstreamMsgID]++
		if seen[m.UpstreamMsgID] == 1 {
			byUser[m.ExternalUserID] = append(byUser[m.ExternalUserID], m.UpstreamMsgID)
		}
	}
	var b strings.Builder
	for user, ids := range want {
		pos := map[string]int{}
		for i, id := range ids {
			pos[id] = i
			switch n := seen[id]; {
			case n == 0:
				lost++
				fmt.Fprintf(&b, "lost %s/%s; ", user, id)
			case n > 1:
				dup += n - 1
				fmt.Fprintf(&b, "dup %s/%s x%d; ", user, id, n)
			}
		}
		last := -1
		for _, id := range byUser[user] {
			if p, ok := pos[id]; ok {
				if p < last {
					reordered++
					fmt.Fprintf(&b, "reordered %s/%s; ", user, id)
				}
				last = p
			}
		}
	}
	return lost, dup, reordered, b.String()
}
