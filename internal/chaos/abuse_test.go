package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// TestChaosPoisonAndAbuse: while ordinary users chat, the pipeline gets
// malformed and oversized records written straight into the main topic, a
// bot user sending 1000 messages a minute through the callback path, and
// one user whose downstream fails every call. Everything must be accounted
// for — an effect or a dead letter with the right reason — and the
// ordinary users' latency must not suffer (p99 within 2× of the same
// users' p99 before the abuse started).
//
// The rate limiter runs with the production default group (normal: 30
// messages in any minute, blocked for an hour after 20 violations). Ordinary
// users send one message every 10 s each (round robin), so they stay
// under it by construction; the failing user is whitelisted by the
// operator API, so its dead letters are about the downstream only.
//
// A handler that panics is not simulated here: the consumer recovers a
// panic into a failed attempt (consumer.safeHandle, covered by the
// consumer package's unit test "panic is a failure"), which is the same
// retry → downstream_error path the Sink's 500s take here. Adding a
// panic switch to the daemons would be a production backdoor.
func TestChaosPoisonAndAbuse(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	const maxBytes = 4096
	baseline := Size(10*time.Second, 20*time.Second)
	abuse := Size(20*time.Second, 60*time.Second)
	const (
		normalUsers = 200
		normalRate  = 20.0   // messages a second over all ordinary users
		botPerMin   = 1000.0 // the bot's rate
		failEvery   = 2 * time.Second
	)
	poisonBatches := Size(2, 3)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1,
		SinkSleep: time.Millisecond,
		ConsumerEnv: map[string]string{
			"KFPIPE_RATE_LIMIT_DEFAULT_GROUP":    "normal",
			"KFPIPE_PROCESSOR_MAX_MESSAGE_BYTES": fmt.Sprint(maxBytes),
		},
		DLQEnv: map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": "normal"},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	tag := p.Prefix[len("chaos-") : len(p.Prefix)-1]
	normal := make([]string, normalUsers)
	kfOf := map[string]string{}
	for i := range normal {
		normal[i] = fmt.Sprintf("u%04d-%s", i, tag)
		kfOf[normal[i]] = p.OpenKfIDs[i%len(p.OpenKfIDs)]
	}
	bot, failing := "bot-"+tag, "fail-"+tag
	kfOf[bot] = p.OpenKfIDs[0]
	kfOf[failing] = p.OpenKfIDs[len(p.OpenKfIDs)-1]
	if err := operatorPost(ctx, p, "/admin/ratelimit/whitelist/"+url.PathEscape(failing)); err != nil {
		t.Fatalf("whitelist the failing user: %v", err)
	}
	p.Sink.FailUser(failing)

	f := &Feeder{p: p, perUser: map[string]int{}}
	rep := &Report{Name: "poison-and-abuse"}
	start := time.Now()
	abuseAt := start.Add(baseline)
	end := abuseAt.Add(abuse)

	// Poison records, straight into the main topic at random moments of
	// the abuse phase.
	var (
		poisonMu   sync.Mutex
		poisonKeys = map[string]string{} // key → kind
	)
	poisonDone := make(chan error, 1)
	go func() {
		if !Pause(ctx, time.Until(abuseAt), time.Until(abuseAt)) {
			poisonDone <- ctx.Err()
			return
		}
		gap := abuse / time.Duration(poisonBatches+1)
		for b := 0; b < poisonBatches; b++ {
			if !Pause(ctx, gap/2, gap) {
				poisonDone <- ctx.Err()
				return
			}
			keys, err := producePoison(ctx, p, fmt.Sprintf("%s-%d", tag, b), maxBytes)
			if err != nil {
				poisonDone <- err
				return
			}
			poisonMu.Lock()
			for k, v := range keys {
				poisonKeys[k] = v
			}
			poisonMu.Unlock()
		}
		poisonDone <- nil
	}()

	// The feed: a burst every 100 ms.
	const tick = 100 * time.Millisecond
	ticker := time.NewTicker(tick)
	next, botAcc, nextFail := 0, 0.0, abuseAt
	perTick := int(normalRate * tick.Seconds())
	for now := time.Now(); now.Before(end); now = time.Now() {
		var users []string
		for range perTick {
			users = append(users, normal[next%len(normal)])
			next++
		}
		if !now.Before(abuseAt) {
			botAcc += botPerMin / 60 * tick.Seconds()
			for ; botAcc >= 1; botAcc-- {
				users = append(users, bot)
			}
			if !now.Before(nextFail) {
				users = append(users, failing)
				nextFail = nextFail.Add(failEvery)
			}
		}
		f.appendUsers(ctx, users, func(_ int, u string) string { return kfOf[u] })
		<-ticker.C
	}
	ticker.Stop()
	if err := <-poisonDone; err != nil {
		t.Fatalf("poison: %v", err)
	}
	fedAt := time.Now()
	settleErr := p.Settle(ctx, f, Size(90*time.Second, 3*time.Minute))
	elapsed := time.Since(start)
	t.Logf("fed in %s, settled %s later", fedAt.Sub(start).Round(time.Millisecond), time.Since(fedAt).Round(time.Millisecond))
	ev, err := p.Collect(ctx, f)
	if err != nil {
		t.Fatalf("collect evidence: %v", err)
	}
	r := ev.Report(rep.Name, elapsed)
	if settleErr != nil {
		r.note("%v", settleErr)
	}
	judgeAbuse(r, ev, abuseJudge{normal: normal, bot: bot, failing: failing, poison: poisonKeys, abuseAt: abuseAt,
		failures: p.Sink.Failures(failing)})
	for _, e := range p.StopAll(15 * time.Second) {
		r.Problem("shutdown: %s", e)
	}
	Finish(t, r)
}

type abuseJudge struct {
	normal       []string
	bot, failing string
	poison       map[string]string // record key → kind
	abuseAt      time.Time
	failures     int // the Sink's 500s to the failing user
}

// judgeAbuse adds the scenario's own accounting to r: dead-letter reasons
// per kind of traffic, poison records found in the DLQ, and the ordinary
// users' latency before and during the abuse.
func judgeAbuse(r *Report, ev *Evidence, j abuseJudge) {
	isNormal := map[string]bool{}
	for _, u := range j.normal {
		isNormal[u] = true
	}
	first := map[string]time.Time{}
	effects := map[string]int{} // user → distinct messages with an effect
	for _, d := range ev.Deliveries {
		if _, ok := first[d.MsgID]; !ok {
			first[d.MsgID] = d.At
			effects[d.User]++
		}
	}
	sentBy := map[string]int{}
	var before, during []time.Duration
	for _, s := range ev.Sent {
		sentBy[s.User]++
		at, ok := first[s.MsgID]
		if !ok || !isNormal[s.User] {
			continue
		}
		if s.At.Before(j.abuseAt) {
			before = append(before, at.Sub(s.At))
		} else {
			during = append(during, at.Sub(s.At))
		}
	}

	allowed := map[string][]string{
		"bot":     {"rate_limited", "user_blocked"},
		"failing": {"downstream_error", "circuit_open"},
		"poison":  {"invalid_message"},
	}
	reasons := map[string]map[string]int{} // kind → reason → dead letters
	poisonSeen := map[string]bool{}
	dlMsgs := map[string]int{} // kind → distinct messages dead-lettered
	for msgid, dls := range ev.DLQ {
		counted := map[string]bool{}
		for _, dl := range dls {
			kind := ""
			switch {
			case dl.User == j.bot:
				kind = "bot"
			case dl.User == j.failing:
				kind = "failing"
			case j.poison[dl.User] != "":
				kind = "poison"
				poisonSeen[dl.User] = true
			case isNormal[dl.User]:
				kind = "normal"
			default:
				r.Problem("dead letter of an unknown user %q (msgid %q, reason %s)", dl.User, msgid, dl.Reason)
				continue
			}
			if reasons[kind] == nil {
				reasons[kind] = map[string]int{}
			}
			reasons[kind][dl.Reason]++
			if !slices.Contains(allowed[kind], dl.Reason) {
				r.Problem("%s traffic dead-lettered with reason %s (user %s, msgid %q)", kind, dl.Reason, dl.User, msgid)
			}
			if !counted[kind] {
				counted[kind] = true
				dlMsgs[kind]++
			}
		}
	}
	// Poison records have no upstream msgid, so the Report cannot see them:
	// each one must be in the DLQ index under its record key.
	missing := 0
	for k := range j.poison {
		if !poisonSeen[k] {
			missing++
			if missing <= 5 {
				r.note("poison record %s (%s) has no dead letter", k, j.poison[k])
			}
		}
	}
	if missing > 0 {
		r.Problem("%d of %d poison records not in the DLQ index", missing, len(j.poison))
	}
	if len(j.poison) == 0 {
		r.Problem("no poison record was produced")
	}
	if sentBy[j.bot] == 0 || dlMsgs["bot"] == 0 {
		r.Problem("the bot (%d sent) was never limited", sentBy[j.bot])
	}
	// normal: 30 in any minute before the first violation, blocked for an
	// hour after the twentieth (about 1.2 s later at the bot's rate);
	// anything above that means the limiter leaked.
	if effects[j.bot] > 35 {
		r.Problem("the bot had %d effects; the normal group should have stopped it after 30", effects[j.bot])
	}
	if effects[j.failing] > 0 {
		r.Problem("the failing user had %d effects although the Sink refused every call", effects[j.failing])
	}
	if dlMsgs["failing"] != sentBy[j.failing] {
		r.Problem("the failing user sent %d, %d dead-lettered", sentBy[j.failing], dlMsgs["failing"])
	}
	if reasons["failing"]["downstream_error"] == 0 {
		r.Problem("no downstream_error dead letter for the failing user")
	}
	if dlMsgs["normal"] > 0 {
		r.Problem("%d messages of ordinary users dead-lettered: %v", dlMsgs["normal"], reasons["normal"])
	}
	p99b, p99d := percentile(before, 0.99), percentile(during, 0.99)
	if len(before) == 0 || len(during) == 0 {
		r.Problem("no ordinary-user latency measured (before %d, during %d)", len(before), len(during))
	} else if p99d > 2*p99b {
		r.Problem("ordinary users' p99 during the abuse %s > 2 × baseline %s", p99d, p99b)
	}
	r.Extra("poison", len(j.poison))
	r.Extra("poison_dlq", len(poisonSeen))
	r.Extra("bot_sent", sentBy[j.bot])
	r.Extra("bot_effects", effects[j.bot])
	r.Extra("bot_dlq", fmtReasons(reasons["bot"]))
	r.Extra("failing_sent", sentBy[j.failing])
	r.Extra("failing_dlq", fmtReasons(reasons["failing"]))
	r.Extra("failing_attempts", j.failures)
	r.Extra("normal_p50_baseline", percentile(before, 0.5).Round(time.Millisecond))
	r.Extra("normal_p99_baseline", p99b.Round(time.Millisecond))
	r.Extra("normal_p50_abuse", percentile(during, 0.5).Round(time.Millisecond))
	r.Extra("normal_p99_abuse", p99d.Round(time.Millisecond))
}

func fmtReasons(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// producePoison writes records the consumer must refuse into the main
// topic: not JSON, JSON without required fields, and a valid message over
// processor.max_message_bytes. It returns their keys (the consumer files
// a record it cannot decode under its key as the user).
func producePoison(ctx context.Context, p *Pipeline, batch string, maxBytes int) (map[string]string, error) {
	pr, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": p.Opts.Brokers, "enable.idempotence": true,
		"acks": "all"})
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	keys := map[string]string{}
	var values []struct{ key, value string }
	add := func(kind, value string) {
		k := fmt.Sprintf("poison-%s-%s-%d", kind, batch, len(values))
		keys[k] = kind
		values = append(values, struct{ key, value string }{k, value})
	}
	for i := range 10 {
		add("notjson", fmt.Sprintf("<xml>not json %d</xml>", i))
	}
	for i := range 10 {
		switch i % 3 {
		case 0: // no upstream msgid
			add("nofield", fmt.Sprintf(`{"open_kfid":%q,"external_userid":"x","content":"hi"}`, p.OpenKfIDs[0]))
		case 1: // no user
			add("nofield", fmt.Sprintf(`{"upstream_msgid":"poison-%s-%d","open_kfid":%q}`, batch, i, p.OpenKfIDs[0]))
		default: // wrong types
			add("nofield", `{"upstream_msgid":17,"open_kfid":["a"]}`)
		}
	}
	for i := range 4 {
		pad := strings.Repeat("x", 2*maxBytes)
		add("oversized", fmt.Sprintf(`{"upstream_msgid":"poison-big-%s-%d","open_kfid":%q,"external_userid":"big-%s","msg_type":"text","content":%q}`,
			batch, i, p.OpenKfIDs[0], batch, pad))
	}
	topic := p.MainTopic
	dr := make(chan kafka.Event, len(values))
	for _, v := range values {
		if err := pr.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: []byte(v.key), Value: []byte(v.value)}, dr); err != nil {
			return nil, err
		}
	}
	for range values {
		select {
		case e := <-dr:
			if m, ok := e.(*kafka.Message); ok && m.TopicPartition.Error != nil {
				return nil, m.TopicPartition.Error
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("poison: no delivery report within 30s")
		}
	}
	return keys, nil
}

// operatorPost makes an operator write through the dlq-consumer's admin API.
func operatorPost(ctx context.Context, p *Pipeline, path string) error {
	return operatorWrite(ctx, p, http.MethodPost, path, `{"reason":"chaos scenario"}`)
}

// operatorWrite makes an operator write with a JSON body through the
// dlq-consumer's admin API.
func operatorWrite(ctx context.Context, p *Pipeline, method, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, method, p.AdminURL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}
