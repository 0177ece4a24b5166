package console

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// memCustomers is a Pipeline that is also a CustomerSource: fixed records
// per user and fixed effects per upstream msgid.
type memCustomers struct {
	memPipeline
	records map[string][]TopicRecord
	effects map[string]MessageEffects
	err     error
	// truncated and incomplete are copied into every scan.
	truncated  bool
	incomplete string
}

func (c *memCustomers) UserRecords(_ context.Context, user string, since time.Time, max int) (TopicScan, error) {
	if c.err != nil {
		return TopicScan{}, c.err
	}
	sc := TopicScan{Topic: "main", Partition: 2, From: 0, To: 100, Truncated: c.truncated, Incomplete: c.incomplete}
	for _, r := range c.records[user] {
		if !r.Time.Before(since) {
			sc.Records = append(sc.Records, r)
		}
	}
	return sc, nil
}

func (c *memCustomers) Effects(_ context.Context, user string, msgs []MessageRef) ([]MessageEffects, error) {
	out := make([]MessageEffects, len(msgs))
	for i, m := range msgs {
		fx, ok := c.effects[m.UpstreamMsgID]
		if !ok {
			fx = MessageEffects{Done: DoneNo}
		}
		out[i] = fx
	}
	return out, nil
}

func rec(off int64, at time.Time, upstream string, retry bool) TopicRecord {
	r := TopicRecord{MainRecord: MainRecord{Partition: 2, Offset: off, Time: at, UpstreamMsgID: upstream, OpenKfID: "wk1",
		MessageID: "9" + upstream, MsgType: "text", SendTime: at.Unix(), Preview: "hello " + upstream, RetryFromDLQ: retry}}
	if retry {
		r.RetryCount = 1
	}
	return r
}

// timelineFixture: an answered customer, one dead-lettered then recovered,
// one blocked whose message the limiter refused, one whose message the bot
// refused for good, one whose message its open breaker refused.
func timelineFixture(t *testing.T) *fixture {
	t.Helper()
	src := &memCustomers{
		records: map[string][]TopicRecord{
			"cust-ok":  {rec(10, t0.Add(-2*time.Hour), "ok-old", false), rec(20, t0.Add(-time.Hour), "ok-new", false)},
			"cust-rec": {rec(30, t0.Add(-3*time.Hour), "rec-1", false), rec(40, t0.Add(-2*time.Hour), "rec-1", true)},
			"cust-blk": {rec(50, t0.Add(-30*time.Minute), "blk-1", false)},
			"cust-hum": {rec(60, t0.Add(-20*time.Minute), "hum-1", false)},
			"cust-rej": {rec(70, t0.Add(-10*time.Minute), "rej-1", false)},
			"cust-brk": {rec(80, t0.Add(-5*time.Minute), "brk-1", false)},
		},
		effects: map[string]MessageEffects{
			"ok-old": {Done: DoneYes, Replies: []ReplyMark{{Key: "wk1:ok-old:0"}}},
			"ok-new": {Done: DoneYes, Replies: []ReplyMark{{Key: "wk1:ok-new:0"}, {Key: "wk1:ok-new:1"}}},
			"rec-1":  {Done: DoneYes},
			"hum-1":  {Done: DoneYes, ReplySkipped: "servicer_session"},
		},
	}
	retryAt := t0.Add(time.Hour)
	f := &fixture{dlq: newMemDLQ(t0,
		DLQMessage{ID: "L-rec", User: "cust-rec", Reason: "downstream_error", State: "retried", RetryCount: 0,
			FailureTime: t0.Add(-3 * time.Hour), SourcePartition: 2, SourceOffset: 30},
		DLQMessage{ID: "L-blk", User: "cust-blk", Reason: "rate_limited", State: "due", NextRetryTime: &retryAt,
			FailureTime: t0.Add(-29 * time.Minute), SourcePartition: 2, SourceOffset: 50},
		DLQMessage{ID: "L-rej", User: "cust-rej", Reason: "handler_rejected", State: "review",
			FailureTime: t0.Add(-9 * time.Minute), SourcePartition: 2, SourceOffset: 70},
		DLQMessage{ID: "L-brk", User: "cust-brk", Reason: "circuit_open", State: "due", NextRetryTime: &retryAt,
			FailureTime: t0.Add(-4 * time.Minute), SourcePartition: 2, SourceOffset: 80},
	), rl: newMemRL(t0)}
	f.rdb, f.prefix = testenv.Redis(t)
	f.rl.block["cust-blk"] = 2 * time.Hour
	return f.start(t, Config{Pipeline: src})
}

func (f *fixture) timeline(t *testing.T, path string) Timeline {
	t.Helper()
	r := f.do(t, "Bearer "+viewerToken, "GET", path, "")
	if r.status != 200 {
		t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var tl Timeline
	if err := json.Unmarshal(r.body, &tl); err != nil {
		t.Fatal(err)
	}
	return tl
}

func TestTimelineAnswered(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-ok/timeline")
	if !tl.Known || len(tl.Messages) != 2 {
		t.Fatalf("known=%v messages=%d: %s", tl.Known, len(tl.Messages), tl.Summary)
	}
	newest := tl.Messages[0]
	if newest.UpstreamMsgID != "ok-new" || tl.Messages[1].UpstreamMsgID != "ok-old" {
		t.Fatalf("not newest first: %s, %s", newest.UpstreamMsgID, tl.Messages[1].UpstreamMsgID)
	}
	if newest.Outcome != OutcomeAnswered || len(newest.Replies) != 2 || newest.Processed != DoneYes || newest.Attempts != 1 {
		t.Fatalf("newest: %+v", newest)
	}
	if !strings.Contains(newest.Story, "partition 2 offset 20") || !strings.Contains(newest.Story, "2 reply(ies) sent") {
		t.Fatalf("story: %s", newest.Story)
	}
	if !strings.Contains(tl.Summary, "2 answered") || tl.Sources["main_topic"] != "ok" || tl.Sources["dedup"] != "ok" {
		t.Fatalf("summary %q sources %v", tl.Summary, tl.Sources)
	}
}

// TestTimelineReplySkipped: a message whose reply WeChat refused because
// a human servicer held the session reads as a skipped reply, processed,
// not a dead letter.
func TestTimelineReplySkipped(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-hum/timeline")
	if len(tl.Messages) != 1 {
		t.Fatalf("messages %d: %s", len(tl.Messages), tl.Summary)
	}
	m := tl.Messages[0]
	if m.Outcome != OutcomeReplySkipped || m.ReplySkipped != "servicer_session" || m.Processed != DoneYes || len(m.Letters) != 0 {
		t.Fatalf("message: %+v", m)
	}
	if !strings.Contains(m.Story, "a human servicer held the session") {
		t.Fatalf("story: %s", m.Story)
	}
}

func TestTimelineDeadLetteredThenRecovered(t *testing.T) {
	f := timelineFixture(t)
	// The operator's retry of the letter shows among the user's events. The
	// letter was re-injected already (retried): the retry is refused as
	// settled (a letter is never selected again once re-injected), and the
	// attempt is audited all the same.
	// Its dry run first: counted, not done, so not among the events.
	if r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/dlq/retry/L-rec", `{"reason":"would it?","dry_run":true}`); r.status != 409 {
		t.Fatalf("dry run: %d %s", r.status, r.body)
	}
	if r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/dlq/retry/L-rec", `{"reason":"customer called"}`); r.status != 409 {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	tl := f.timeline(t, "/admin/customers/cust-rec/timeline")
	if len(tl.Messages) != 1 {
		t.Fatalf("messages: %+v", tl.Messages)
	}
	m := tl.Messages[0]
	if len(m.Received) != 2 || !m.Received[1].RetryFromDLQ || len(m.Letters) != 1 || m.Letters[0].ID != "L-rec" {
		t.Fatalf("received %+v letters %+v", m.Received, m.Letters)
	}
	if m.Outcome != OutcomeProcessed || m.Attempts != 2 || m.Limiter != "admitted" {
		t.Fatalf("outcome %s attempts %d limiter %s", m.Outcome, m.Attempts, m.Limiter)
	}
	if !strings.Contains(m.Story, "dead letter L-rec (downstream_error)") || !strings.Contains(m.Story, "re-delivered 1 time(s)") {
		t.Fatalf("story: %s", m.Story)
	}
	if len(tl.Events) != 1 || tl.Events[0].Kind != "operator" || tl.Events[0].Reason != "customer called" ||
		!strings.HasPrefix(tl.Events[0].What, "dlq.retry") || tl.Events[0].AuditID == "" {
		t.Fatalf("events: %+v", tl.Events)
	}
}

func TestTimelineBlocked(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-blk/timeline")
	m := tl.Messages[0]
	if m.Limiter != "refused" || m.Outcome != OutcomeInDLQ || m.Processed != DoneNo {
		t.Fatalf("message: %+v", m)
	}
	if tl.Limiter == nil || !tl.Limiter.Blocked || !strings.Contains(tl.Summary, "blocked by the rate limiter now") {
		t.Fatalf("limiter %+v summary %q", tl.Limiter, tl.Summary)
	}
	if len(tl.Events) == 0 || tl.Events[0].Kind != "block" {
		t.Fatalf("events: %+v", tl.Events)
	}
}

// TestTimelineHandlerRejected: a message the bot refused for good
// (handler_rejected) was admitted by the limiter, waits in review, and the
// story says the bot refused it (not that the record is broken).
func TestTimelineHandlerRejected(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-rej/timeline")
	if len(tl.Messages) != 1 {
		t.Fatalf("messages: %+v", tl.Messages)
	}
	m := tl.Messages[0]
	if m.Limiter != "admitted" || m.Outcome != OutcomeInDLQ || m.Processed != DoneNo {
		t.Fatalf("message: %+v", m)
	}
	if !strings.Contains(m.Story, "dead letter L-rej (handler_rejected: the bot refused it for good) waiting for manual review") {
		t.Fatalf("story: %s", m.Story)
	}
}

// TestTimelineBreakerBeforeLimiter: a message refused by the user's open
// circuit breaker (circuit_open) never reached the rate limiter, which
// the breaker stands before: the timeline does not say the limiter
// admitted it.
func TestTimelineBreakerBeforeLimiter(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-brk/timeline")
	if len(tl.Messages) != 1 {
		t.Fatalf("messages: %+v", tl.Messages)
	}
	m := tl.Messages[0]
	if m.Limiter != "unknown" || m.Outcome != OutcomeInDLQ || strings.Contains(m.Story, "admitted by the rate limiter") {
		t.Fatalf("limiter %s outcome %s story %q: a circuit_open letter was not admitted by the limiter", m.Limiter, m.Outcome, m.Story)
	}
}

func TestTimelineMadeUpUser(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/nobody-at-all/timeline")
	if tl.Known || len(tl.Messages) != 0 || len(tl.Events) != 0 || !strings.HasPrefix(tl.Summary, "nothing known about user nobody-at-all") {
		t.Fatalf("made-up user: %+v", tl)
	}
	real := f.timeline(t, "/admin/customers/cust-ok/timeline")
	if real.Summary == tl.Summary || !real.Known {
		t.Fatal("a real user and a made-up id look the same")
	}
}

func TestTimelineMsgIDAndWindow(t *testing.T) {
	f := timelineFixture(t)
	tl := f.timeline(t, "/admin/customers/cust-ok/timeline?msgid=ok-old")
	if len(tl.Messages) != 1 || tl.Messages[0].UpstreamMsgID != "ok-old" || !strings.Contains(tl.Summary, "message ok-old") {
		t.Fatalf("msgid filter: %+v", tl.Messages)
	}
	if tl := f.timeline(t, "/admin/customers/cust-ok/timeline?msgid=nope"); len(tl.Messages) != 0 || !tl.Known ||
		!strings.HasPrefix(tl.Summary, "message nope of user cust-ok is not kept") {
		t.Fatalf("unknown msgid: %+v", tl)
	}
	// Our own message id finds it too.
	if tl := f.timeline(t, "/admin/customers/cust-ok/timeline?msgid=9ok-new"); len(tl.Messages) != 1 {
		t.Fatalf("message_id filter: %d", len(tl.Messages))
	}
	// A 90-minute window leaves the older message out.
	if tl := f.timeline(t, "/admin/customers/cust-ok/timeline?window=90m"); len(tl.Messages) != 1 || tl.Messages[0].UpstreamMsgID != "ok-new" {
		t.Fatalf("window: %+v", tl.Messages)
	}
	for _, q := range []string{"?window=nope", "?window=1s", "?window=999h", "?max_records=0", "?max_records=x"} {
		r := f.do(t, "Bearer "+viewerToken, "GET", "/admin/customers/cust-ok/timeline"+q, "")
		if r.status != 400 || r.json(t)["field"] == "" {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
	}
	if r := f.do(t, "", "GET", "/admin/customers/cust-ok/timeline", ""); r.status != 401 {
		t.Fatalf("anonymous: %d", r.status)
	}
}

// Without a CustomerSource (or with it failing) the timeline still tells
// what the DLQ, the limiter and the audit stream know, and says what was
// not read.
func TestTimelineWithoutMainTopic(t *testing.T) {
	f := &fixture{dlq: newMemDLQ(t0, sampleMessages()...), rl: newMemRL(t0)}
	f.rdb, f.prefix = testenv.Redis(t)
	f.start(t, Config{})
	tl := f.timeline(t, "/admin/customers/u1/timeline")
	if tl.Sources["main_topic"] != "not configured" || !tl.Known || len(tl.Messages) != 2 {
		t.Fatalf("sources %v known %v messages %d", tl.Sources, tl.Known, len(tl.Messages))
	}
	for _, m := range tl.Messages {
		if m.Processed != DoneUnknown || !strings.Contains(m.Story, "no record left on the main topic") {
			t.Fatalf("message: %+v", m)
		}
	}

	g := timelineFixture(t)
	g.srv.cfg.Pipeline.(*memCustomers).err = context.DeadlineExceeded
	tl = g.timeline(t, "/admin/customers/cust-blk/timeline")
	if tl.Sources["main_topic"] != "unavailable" || len(tl.Messages) != 1 || tl.Messages[0].Letters[0].ID != "L-blk" {
		t.Fatalf("sources %v messages %+v", tl.Sources, tl.Messages)
	}
}

// A read that stopped short or was capped says so in the notes.
func TestTimelinePartialRead(t *testing.T) {
	f := timelineFixture(t)
	src := f.srv.cfg.Pipeline.(*memCustomers)
	src.truncated, src.incomplete = true, "the read stopped at offset 7 of 9"
	tl := f.timeline(t, "/admin/customers/cust-ok/timeline?max_records=50")
	notes := strings.Join(tl.Notes, "; ")
	if !strings.Contains(notes, "main topic: the read stopped at offset 7 of 9") ||
		!strings.Contains(notes, "only the partition's newest 50 records were read") || !tl.Topic.Truncated {
		t.Fatalf("notes %q topic %+v", notes, tl.Topic)
	}
}
