package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// common points a loaded config at the test services with fresh names.
type recorder struct {
	mu       sync.Mutex
	byKey    map[string]int
	order    map[string][]string
	attempts map[string]int
}

// Handle records effects; wm-flaky fails its first 3 attempts (the
// in-place retries) so it goes through the DLQ and comes back; wm-broken
// always fails.
func (r *recorder) Handle(_ context.Context, m *chatmsg.ChatMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts[m.UpstreamMsgID]++
	switch {
	case m.ExternalUserID == "wm-broken":
		return errors.New("downstream unavailable")
	case m.ExternalUserID == "wm-flaky" && r.attempts[m.UpstreamMsgID] <= 3:
		return errors.New("downstream hiccup")
	}
	r.byKey[m.UpstreamMsgID]++
	r.order[m.ExternalUserID] = append(r.order[m.ExternalUserID], m.UpstreamMsgID)
	return nil
}

// TestPipelineEndToEnd runs the three daemons' wiring in one process on
// the real broker and Redis, feeds messages through the signed callback
// and the fake WeChat, and checks: every message handled once and in
// order per user; a flooding user's excess dead-lettered and indexed by
// the dlq-consumer; the admin API answers with the operator token only.
// It runs on the single test Redis and on the test Redis Cluster (every
// Redis user of the three daemons in redis.mode cluster, the consumer's
// state store included, whose partitions then live on several masters).
func TestPipelineEndToEnd(t *testing.T) {
	t.Run("single", func(t *testing.T) { pipelineEndToEnd(t, false) })
	t.Run("cluster", func(t *testing.T) { pipelineEndToEnd(t, true) })
}

func pipelineEndToEnd(t *testing.T, cluster bool) {
	pc := newPlaceOn(t, cluster)
	rdb, prefix := pc.rdb, pc.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const kf = "wk-e2e"

	fake := wecomtest.New(wecomtest.Options{CorpID: "ww-test-corp", Secret: "test-secret", Accounts: []string{kf}})
	defer fake.Close()

	pcfg := pc.producerConfig(t, fake, kf)
	if cluster {
		pc.mainTopic = spreadTopic(t, pc.cc, pc.mainTopic, pcfg.Kafka.Topics.Main.Partitions)
		pcfg.Kafka.Topics.Main.Name = pc.mainTopic
	}

	ccfg := pc.consumerConfig(t)
	// The seed's rule, so that the flooder's 12 messages are refused (the
	// shipped normal group lets a burst of 12 through).
	ccfg.RateLimit.DefaultGroup = "seed"

	dcfg := pc.dlqConfig(t)
	dcfg.Recovery.MaxRetries["downstream_error"] = 1
	dcfg.RateLimit.DefaultGroup = "seed"

	rec := &recorder{byKey: map[string]int{}, order: map[string][]string{}, attempts: map[string]int{}}
	pl := startPipeline(t, ctx, pcfg, ccfg, dcfg, func(*daemon.Base) handler.Handler { return rec })
	defer pl.close(t)
	d := pl.d

	// 40 users × 3 messages (inside the seed group's 5 per 10 s), and
	// one flooder with 12 messages (5 pass, the rest are refused).
	var want []string
	order := map[string][]string{}
	for round := 0; round < 3; round++ {
		for u := 0; u < 40; u++ {
			user := fmt.Sprintf("wm-user-%d", u)
			id := fake.AddText(kf, user, fmt.Sprintf("hello %d", round))
			want = append(want, id)
			order[user] = append(order[user], id)
		}
	}
	for i := 0; i < 12; i++ {
		fake.AddText(kf, "wm-flooder", fmt.Sprintf("spam %d", i))
	}
	flaky := fake.AddText(kf, "wm-flaky", "first try fails")
	broken := fake.AddText(kf, "wm-broken", "never works")
	resp, err := callbackSender(pl, pcfg).SendEvent(ctx, kf, fake.IssueToken(kf))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "success" {
		t.Fatalf("callback answered %d %q", resp.StatusCode, body)
	}

	testenv.Eventually(t, 90*time.Second, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, id := range want {
			if rec.byKey[id] == 0 {
				return fmt.Errorf("message %s not handled yet", id)
			}
		}
		flooded, flakyRuns := len(rec.order["wm-flooder"]), rec.byKey[flaky]
		return testenv.Check(flooded == 5 && flakyRuns == 1, "the flooder's messages handled %d (want 5), the flaky one %d (want 1)", flooded, flakyRuns)
	})
	rec.mu.Lock()
	for _, id := range want {
		if n := rec.byKey[id]; n != 1 {
			t.Errorf("msg %s handled %d times", id, n)
		}
	}
	for user, ids := range order {
		if got := strings.Join(rec.order[user], ","); got != strings.Join(ids, ",") {
			t.Errorf("user %s order %s, want %s", user, got, strings.Join(ids, ","))
		}
	}
	// Read under the lock: handlers of other messages (the broken user's
	// DLQ retries) may still be running.
	if rec.attempts[flaky] != 4 {
		t.Errorf("flaky message attempts = %d, want 3 in place + 1 after the DLQ retry", rec.attempts[flaky])
	}
	rec.mu.Unlock()

	// The flooder's 7 refusals reach the DLQ index through the topic, and
	// the broken user's message ends in manual review after max retries.
	op, viewer := dcfg.Admin.Tokens[0].Token, dcfg.Admin.Tokens[1].Token
	var stats struct {
		Total    int64            `json:"total"`
		ByReason map[string]int64 `json:"by_reason"`
		Review   int64            `json:"review"`
		Retried  int64            `json:"retried"`
	}
	var lastList []byte
	defer func() {
		if t.Failed() {
			t.Logf("last stats %+v\nlast review list %s", stats, lastList)
		}
	}()
	testenv.Eventually(t, 60*time.Second, func() error {
		code, b := adminGet(t, d.AdminURL+"/admin/dlq/stats", viewer)
		if code != 200 || json.Unmarshal(b, &stats) != nil {
			return testenv.Check(false, "dead letters indexed")
		}
		// Lists carry summaries; the export reads whole letters from the
		// DLQ topic.
		code, b = adminGet(t, d.AdminURL+"/admin/dlq/export?format=json&user=wm-broken&review=true", viewer)
		lastList = b
		return testenv.Check(code == 200 && strings.Contains(string(b), broken) && flooderRefused(t, d.AdminURL, viewer) == 7, "dead letters indexed")
	})
	// A rate_limited letter indexed before the limiter's block reached
	// Redis (the block is written asynchronously) may be retried and
	// refused again as user_blocked (unless the scheduler sees the block
	// first and holds it): the same letter, updated (a message has one
	// letter). Here wait until nothing changes.
	testenv.Eventually(t, 30*time.Second, func() error {
		before := stats
		time.Sleep(1500 * time.Millisecond)
		code, b := adminGet(t, d.AdminURL+"/admin/dlq/stats", viewer)
		return testenv.Check(code == 200 && json.Unmarshal(b, &stats) == nil && fmt.Sprint(stats) == fmt.Sprint(before), "dead letter stats settled")
	})
	// One letter a message: the broken message's retry that failed again
	// is its letter's second failure, not a second letter.
	if n := stats.ByReason["downstream_error"]; n != 2 {
		t.Errorf("downstream_error dead letters = %d, want 2 (flaky's and broken's)", n)
	}
	var brokenPage struct {
		Messages []struct {
			Failures int `json:"failures"`
		} `json:"messages"`
	}
	if code, b := adminGet(t, d.AdminURL+"/admin/dlq/messages?user=wm-broken", viewer); code != 200 || json.Unmarshal(b, &brokenPage) != nil ||
		len(brokenPage.Messages) != 1 || brokenPage.Messages[0].Failures < 2 {
		t.Errorf("the broken user's letters: %d %s, want one that failed at least twice", code, b)
	}
	code, b := adminGet(t, d.AdminURL+"/admin/dlq/messages?user=wm-flooder", viewer)
	if code != 200 || !strings.Contains(string(b), "wm-flooder") {
		t.Fatalf("list by user = %d %s", code, b)
	}
	if code, _ := adminGet(t, d.AdminURL+"/admin/dlq/stats", ""); code != 401 {
		t.Fatalf("stats without token = %d, want 401", code)
	}
	req, _ := http.NewRequest("POST", d.AdminURL+"/admin/ratelimit/unblock/wm-flooder", strings.NewReader(`{"reason":"e2e"}`))
	req.Header.Set("Authorization", "Bearer "+viewer)
	if code, err := doClose(req); err != nil || code != 403 {
		t.Fatalf("viewer unblock = %v %v, want 403", code, err)
	}
	req, _ = http.NewRequest("POST", d.AdminURL+"/admin/ratelimit/unblock/wm-flooder", strings.NewReader(`{"reason":"e2e"}`))
	req.Header.Set("Authorization", "Bearer "+op)
	req.Header.Set("Content-Type", "application/json")
	if code, err := doClose(req); err != nil || code/100 != 2 {
		t.Fatalf("operator unblock = %v %v", code, err)
	}

	// Rebuilding the index from the DLQ topic gives the same counts.
	t.Setenv("KFPIPE_KAFKA_BROKERS", dcfg.Kafka.Brokers)
	t.Setenv("KFPIPE_KAFKA_TOPICS_MAIN_NAME", pc.mainTopic)
	t.Setenv("KFPIPE_KAFKA_TOPICS_DLQ_NAME", pc.dlqTopic)
	t.Setenv("KFPIPE_REDIS_ADDR", dcfg.Redis.Addr)
	if cluster {
		t.Setenv("KFPIPE_REDIS_MODE", "cluster")
		t.Setenv("KFPIPE_REDIS_CLUSTER_ADDRS", strings.Join(dcfg.Redis.ClusterAddrs, ","))
	}
	t.Setenv("KFPIPE_REDIS_KEY_PREFIX", prefix)
	t.Setenv("KFPIPE_RECOVERY_MAX_RETRIES_DOWNSTREAM_ERROR", "1")
	if code, b := adminGet(t, d.AdminURL+"/admin/dlq/stats", viewer); code != 200 || json.Unmarshal(b, &stats) != nil {
		t.Fatalf("stats before rebuild: %d %s", code, b)
	}
	before := stats
	if err := RunDLQ(ctx, []string{"rebuild", "--config", "../../config/test.yaml"}); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	// Retried moves meanwhile both ways: the scheduler keeps retrying due
	// letters, and the settle loop takes a retried letter whose message
	// is done out of it (a CI run read 1 before and 0 after). The letters
	// themselves must be the same.
	code, b = adminGet(t, d.AdminURL+"/admin/dlq/stats", viewer)
	if code != 200 || json.Unmarshal(b, &stats) != nil || stats.Total != before.Total || stats.Review != before.Review ||
		fmt.Sprint(stats.ByReason) != fmt.Sprint(before.ByReason) || before.Review != 1 {
		t.Fatalf("after rebuild %d %+v, before %+v", code, stats, before)
	}

	// The cursor was stored only after delivery: it equals the fake's last.
	testenv.Eventually(t, 10*time.Second, func() error {
		got, want := rdb.Get(ctx, prefix+"cursor:"+redisconn.Tag(rdb, kf)).Val(), fake.LastCursor(kf)
		return testenv.Check(got == want, "cursor %q stored, want the fake's last %q", got, want)
	})

	if cluster {
		// The consumer's state store ran on the cluster, its partitions'
		// keys on more than one master.
		masters := map[string]int{}
		var mu sync.Mutex
		err := pc.cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys, _, err := m.Scan(ctx, 0, prefix+"st:*", 10000).Result()
			mu.Lock()
			masters[m.Options().Addr] += len(keys)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		with := 0
		for _, n := range masters {
			if n > 0 {
				with++
			}
		}
		t.Logf("state keys by master: %v", masters)
		if with < 2 {
			t.Errorf("state keys by master %v: want keys on at least 2 masters", masters)
		}
	}
}

// spreadTopic returns name, or name with a suffix, such that the hash slots
// of the state store's partitions of the topic ("{topic:p}", p <
// partitions) are served by at least two masters of the cluster: a random
// name leaves all of them on one master now and then.
func spreadTopic(t *testing.T, cc *redis.ClusterClient, name string, partitions int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	//lint:ignore SA1019 CLUSTER SLOTS lists each range's master first, which is all this needs; Redis 7.0 serves it
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	master := func(slot int) string {
		for _, r := range slots {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr
			}
		}
		return ""
	}
	for i := 0; i < 100; i++ {
		n := name
		if i > 0 {
			n = fmt.Sprintf("%s-%d", name, i)
		}
		seen := map[string]bool{}
		for p := 0; p < partitions; p++ {
			seen[master(redisconn.Slot("{"+n+":"+strconv.Itoa(p)+"}"))] = true
		}
		if len(seen) >= 2 {
			return n
		}
	}
	t.Fatalf("no topic name near %s spreads its partitions over 2 masters", name)
	return ""
}

// flooderRefused counts the distinct messages of wm-flooder in the DLQ
// index (a message refused twice has two dead letters).
func flooderRefused(t *testing.T, adminURL, token string) int {
	t.Helper()
	code, b := adminGet(t, adminURL+"/admin/dlq/export?format=json&user=wm-flooder", token)
	if code != 200 {
		return -1
	}
	ids := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m struct {
			Message struct {
				UpstreamMsgID string `json:"upstream_msgid"`
			} `json:"message"`
		}
		if line == "" {
			continue
		}
		if json.Unmarshal([]byte(line), &m) != nil {
			return -1
		}
		ids[m.Message.UpstreamMsgID] = true
	}
	return len(ids)
}

// doClose sends req and closes the response body: an unclosed body keeps
// the connection's goroutines alive after the test (goleak reports them).
func doClose(req *http.Request) (int, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func adminGet(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A ping that does not come back (go-redis waiting on a new connection to
// a blackholed Redis, deaf to the ping's context) still counts as failing:
// the standby comes after "after", not when the ping returns, and ends at
// the first success after it.
func TestWatchRedisStandsByWhileAPingHangs(t *testing.T) {
	release := make(chan struct{})
	var hung atomic.Bool
	ping := func(context.Context) error {
		if hung.CompareAndSwap(false, true) {
			<-release // the first ping hangs, whatever its context says
		}
		return nil
	}
	calls := make(chan bool, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchRedis(ctx, ping, 10*time.Millisecond, 200*time.Millisecond, func(on bool, _ string) { calls <- on })
	}()
	defer func() { cancel(); <-done }()
	start := time.Now()
	select {
	case on := <-calls:
		if !on || time.Since(start) < 200*time.Millisecond {
			t.Fatalf("standby(%v) %s after the ping hung, want on after ≥ 200ms", on, time.Since(start))
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("no standby 5 s into a ping that hangs")
	}
	close(release)
	select {
	case on := <-calls:
		if on {
			t.Fatal("standby(true) twice")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("standby not ended once pings succeed again")
	}
}

// watchRedis stands the consumer by only after Redis has failed for the
// whole "after", ignores a shorter blip, and ends the standby at the first
// success.
func TestWatchRedisStandsByAfterSustainedLoss(t *testing.T) {
	var down atomic.Bool
	var lastOK atomic.Int64 // unix ns of the last ping that succeeded
	ping := func(context.Context) error {
		if down.Load() {
			return errors.New("dial tcp: i/o timeout")
		}
		lastOK.Store(time.Now().UnixNano())
		return nil
	}
	type call struct {
		on bool
		at time.Time
	}
	calls := make(chan call, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchRedis(ctx, ping, 10*time.Millisecond, 200*time.Millisecond, func(on bool, why string) {
			if on && !strings.Contains(why, "processor.standby_after_redis_lost") {
				t.Errorf("standby reason does not name the setting: %q", why)
			}
			calls <- call{on, time.Now()}
		})
	}()
	defer func() { cancel(); <-done }()

	// A blip shorter than "after": no standby.
	down.Store(true)
	time.Sleep(80 * time.Millisecond)
	down.Store(false)
	select {
	case c := <-calls:
		t.Fatalf("standby(%v) after an 80 ms blip", c.on)
	case <-time.After(300 * time.Millisecond):
	}
	// A sustained loss: standby once, not before "after" — counted from
	// the last ping that succeeded (the watcher cannot know the loss began
	// any earlier; on a loaded machine that ping may be well before).
	down.Store(true)
	select {
	case c := <-calls:
		since := c.at.Sub(time.Unix(0, lastOK.Load()))
		if !c.on || since < 200*time.Millisecond {
			t.Fatalf("standby(%v) %s after the last good ping, want on after ≥ 200ms", c.on, since)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no standby 5 s into a sustained Redis loss")
	}
	down.Store(false)
	select {
	case c := <-calls:
		if c.on {
			t.Fatal("standby(true) twice")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("standby not ended after Redis answered again")
	}
}
