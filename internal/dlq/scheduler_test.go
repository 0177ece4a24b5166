package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func newScheduler(t *testing.T, cfgBrokers, mainTopic string, idx *Index, clk Clock, opts ...Option) *Scheduler {
	t.Helper()
	return newSchedulerDLQ(t, cfgBrokers, mainTopic, testenv.Topic(t, 2), idx, clk, opts...)
}

// newSchedulerDLQ is newScheduler whose "retried" events go to dlqTopic.
func newSchedulerDLQ(t *testing.T, cfgBrokers, mainTopic, dlqTopic string, idx *Index, clk Clock, opts ...Option) *Scheduler {
	t.Helper()
	return schedulerWith(t, testConfig(t, cfgBrokers, mainTopic, dlqTopic), idx, clk, opts...)
}

// schedulerWith is a scheduler of cfg (its DLQ group, with the DLQ
// consumer of a test that runs one).
func schedulerWith(t *testing.T, cfg *config.DLQConsumer, idx *Index, clk Clock, opts ...Option) *Scheduler {
	t.Helper()
	rdb := idx.rdb
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: idx.prefix},
		rdb, idx, NewPolicy(testRecovery()), append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// A recoverable dead letter becomes due after its backoff; the scheduler
// puts the original back on the main topic with the retry headers, and
// the index learns about it only then.
func TestSchedulerRetriesWhenDue(t *testing.T) { testenv.EachRedis(t, eachSchedulerRetriesWhenDue) }

func eachSchedulerRetriesWhenDue(t *testing.T, rdb redis.UniversalClient, prefix string) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 2)
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("ivy", ReasonDownstreamError, 3, clk.Now())
	placeIndexed(t, ctx, idx, pol, dl)
	dlqTopic := testenv.Topic(t, 2)
	s := newSchedulerDLQ(t, brokers, mainTopic, dlqTopic, idx, clk)

	clk.Add(59 * time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 0 {
		t.Fatalf("before due: sent %d %v", n, err)
	}
	clk.Add(2 * time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 1 {
		t.Fatalf("when due: sent %d %v", n, err)
	}
	msgs := readTopic(t, brokers, mainTopic, 1, 300*time.Millisecond)
	if len(msgs) != 1 {
		t.Fatalf("%d records on main topic", len(msgs))
	}
	m := msgs[0]
	if string(m.Key) != "ivy" || !bytes.Equal(m.Value, dl.OriginalValue) {
		t.Errorf("record key %q value %q", m.Key, m.Value)
	}
	if header(m, chatmsg.HeaderRetryFromDLQ) != "true" || header(m, chatmsg.HeaderRetryCount) != "1" ||
		header(m, chatmsg.HeaderOriginalFailure) != "downstream_error" || header(m, chatmsg.HeaderMsgType) != "text" {
		t.Errorf("headers %v", m.Headers)
	}
	e, _ := idx.Get(ctx, dl.ID)
	st, _ := idx.Stats(ctx)
	if e.State != StateRetried || st.Due != 0 || st.Retried != 1 {
		t.Errorf("index after ack: %s %+v", e.State, st)
	}
	// The retried event went to the DLQ topic in the same transaction.
	if evs := readTopic(t, brokers, dlqTopic, 1, 300*time.Millisecond); len(evs) != 1 ||
		header(evs[0], HeaderEvent) != EventRetried || header(evs[0], HeaderDLQID) != dl.ID || string(evs[0].Key) != "ivy" {
		t.Errorf("events on the DLQ topic: %d %v", len(evs), evs)
	}
	// Nothing more to send.
	clk.Add(time.Hour)
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Errorf("sent again: %d", n)
	}

	// The retried message fails again in the consumer: dead-lettered with
	// the header's retry_count, it is scheduled with a doubled delay, and
	// after max retries it goes to review.
	again := chatmsg.NewDeadLetter(chatmsg.Source{Topic: mainTopic, Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
		Key: m.Key, Value: m.Value, Headers: toHeaders(m)}, ReasonDownstreamError, "again", clk.Now())
	pol.Place(ctx, again)
	if again.RetryCount != 1 || again.NextRetryTime.Sub(clk.Now()) != 2*time.Minute {
		t.Fatalf("again: retry %d next %v", again.RetryCount, again.NextRetryTime)
	}
	last := deadLetter("ivy", ReasonDownstreamError, 4, clk.Now())
	last.RetryCount = 5
	placeIndexed(t, ctx, idx, pol, last)
	if st, _ := idx.Stats(ctx); st.Review != 1 {
		t.Fatalf("exhausted not in review: %+v", st)
	}
}

func toHeaders(m *kafka.Message) []chatmsg.Header {
	hs := make([]chatmsg.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = chatmsg.Header{Key: h.Key, Value: h.Value}
	}
	return hs
}

// Kafka never acknowledges: the index is not touched and the entry is due
// again after its lease.
func TestSchedulerNoAckNoIndexUpdate(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("jay", ReasonQueueFull, 1, clk.Now())
	placeIndexed(t, ctx, idx, pol, dl)
	cfg := testConfig(t, "127.0.0.1:1", "nowhere", "unused")
	cfg.Kafka.Producer.DeliveryTimeout = 500 * time.Millisecond
	cfg.Kafka.Producer.LingerMs = 0
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: prefix},
		rdb, idx, NewPolicy(testRecovery()), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	clk.Add(2 * time.Minute)
	n, err := s.ScanOnce(ctx)
	if n != 0 || err == nil {
		t.Fatalf("sent %d err %v, want 0 and an error", n, err)
	}
	e, _ := idx.Get(ctx, dl.ID)
	if e.State != StateDue || e.Attempts != 0 {
		t.Fatalf("entry changed without ack: %+v", e)
	}
	st, _ := idx.Stats(ctx)
	if st.Due != 1 || st.Retried != 0 {
		t.Fatalf("stats %+v", st)
	}
	clk.Add(2 * time.Minute) // past the reschedule
	if c, _ := idx.claim(ctx, clk.Now(), 10, time.Minute); len(c) != 1 {
		t.Fatalf("not due again: %d", len(c))
	}
}

// Two replicas on the same Redis: every due retry goes out once.
func TestTwoSchedulersSendOnce(t *testing.T) { testenv.EachRedis(t, eachTwoSchedulersSendOnce) }

func eachTwoSchedulersSendOnce(t *testing.T, rdb redis.UniversalClient, prefix string) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 2)
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	const n = 30
	for i := range n {
		dl := deadLetter("user-"+strconv.Itoa(i%7), ReasonDownstreamError, int64(i), clk.Now())
		placeIndexed(t, ctx, idx, pol, dl)
	}
	a := newScheduler(t, brokers, mainTopic, idx, clk)
	b := newScheduler(t, brokers, mainTopic, testIndex(rdb, prefix, clk), clk)
	a.Start()
	b.Start()
	clk.Add(time.Minute)
	testenv.Eventually(t, 20*time.Second, func() error {
		st, _ := idx.Stats(ctx)
		return testenv.Check(st.Retried == n, "all retried: %d of %d", st.Retried, n)
	})
	// Both also scan directly, racing the loops: claims are leased.
	_, _ = a.ScanOnce(ctx)
	_, _ = b.ScanOnce(ctx)
	msgs := readTopic(t, brokers, mainTopic, n, time.Second)
	if len(msgs) != n {
		t.Fatalf("%d retries on the main topic, want %d", len(msgs), n)
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[string(m.Value)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct retries, want %d", len(seen), n)
	}
}

// The schedule lives in Redis: a scheduler that stops before the due time
// loses nothing, the next one sends it.
func TestSchedulerRestartLosesNothing(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("kim", ReasonCircuitOpen, 1, clk.Now())
	placeIndexed(t, ctx, idx, pol, dl)
	first := newScheduler(t, brokers, mainTopic, idx, clk)
	first.Start()
	time.Sleep(100 * time.Millisecond) // it scans, nothing is due
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	second := newScheduler(t, brokers, mainTopic, testIndex(rdb, prefix, clk), clk)
	second.Start()
	testenv.Eventually(t, 10*time.Second, func() error {
		e, err := idx.Get(ctx, dl.ID)
		return testenv.Check(err == nil && e.State == StateRetried, "retried by the second scheduler")
	})
	readTopic(t, brokers, mainTopic, 1, 0)
}

// A user's retries, whatever their reason, are paced at max_messages/2 per
// window of the user's group and come back in the user's order; another
// user is not held up by them. Under the shipped normal group (30 a
// minute) 20 letters of one user go 15 now, 5 a window later. Before, only
// rate_limited and user_blocked letters were paced: a user's 20
// downstream_error letters went back at once.
func TestSchedulerPacesAUsersRetries(t *testing.T) {
	f := newSchedFixture(t)
	brokers, mainTopic, idx, clk, ctx := f.brokers, f.mainTopic, f.idx, f.clk, context.Background()
	put := func(user string, reason Reason, off int64) { f.put(deadLetter(user, reason, off, clk.Now())) }
	for i := range 20 {
		reason := ReasonDownstreamError
		if i%4 == 3 {
			reason = ReasonRateLimited
		}
		put("loud", reason, int64(i))
	}
	for i := range 3 {
		put("quiet", ReasonDownstreamError, int64(100+i))
	}
	s := newScheduler(t, brokers, mainTopic, idx, clk)
	warmUp(t, s)
	clk.Add(time.Minute)
	if n, err := s.ScanOnce(ctx); err != nil || n != 15+3 {
		t.Fatalf("first window sent %d %v, want 15 of loud and 3 of quiet", n, err)
	}
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Fatalf("same window sent %d more", n)
	}
	clk.Add(59 * time.Second)
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Fatalf("a second before loud's next window sent %d", n)
	}
	clk.Add(time.Second + 10*time.Millisecond)
	if n, _ := s.ScanOnce(ctx); n != 5 {
		t.Fatalf("second window sent %d, want 5", n)
	}
	order := upstreamOrder(t, brokers, mainTopic, 23, "loud")
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("up-%d", i))
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("loud's retries on the main topic in the order %v, want %v", order, want)
	}
}

// failRetriedMarks is a go-redis hook that fails the index's "retried"
// updates: the scheduler dies, in effect, between Kafka's commit and
// the index update.
type failRetriedMarks struct{}

func (failRetriedMarks) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failRetriedMarks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if a == EventRetried {
				return errors.New("injected: index update lost")
			}
		}
		return next(ctx, cmd)
	}
}
func (failRetriedMarks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCommittedRetryIsNotSentAgain: the scheduler re-injects a letter and
// its index update is lost (as when it is killed right after Kafka's
// commit). The retry and its "retried" event were one transaction, so the
// event is in the DLQ topic; the DLQ consumer indexes it, and a scheduler
// scanning after the claim lease sends nothing more: the main topic holds
// the retry once. Before, the event went separately after the index
// update, and the letter was re-sent when its lease ran out.
func TestCommittedRetryIsNotSentAgain(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	letters := topicLetters(t, e.cfg)
	p, err := NewProducer(ProducerConfig{Kafka: e.cfg.Kafka, DLQ: e.cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	dl := deadLetter("lee", ReasonDownstreamError, 1, e.clk.Now())
	dl.EnsureID()
	sendSync(t, p, dl)
	idx := NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(letters))
	c, err := NewConsumer(ConsumerConfig{Kafka: e.cfg.Kafka}, idx, NewPolicy(testRecovery()), WithClock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	testenv.Eventually(t, 20*time.Second, func() error { n, _ := idx.Size(ctx); return testenv.Check(n == 1, "indexed: size %d, want 1", n) })

	broken := redis.NewClient(e.rdb.Options())
	broken.AddHook(failRetriedMarks{})
	defer broken.Close()
	first := schedulerWith(t, e.cfg, NewIndex(broken, e.prefix, WithClock(e.clk), WithLetters(letters)), e.clk)
	e.clk.Add(2 * time.Minute)
	if n, err := first.ScanOnce(ctx); n != 1 || err == nil {
		t.Fatalf("first scan: sent %d, %v; want 1 and the lost index update", n, err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		en, err := idx.Get(ctx, dl.ID)
		return testenv.Check(err == nil && en.State == StateRetried && en.Attempts == 1, "the retried event indexed from the DLQ topic")
	})
	e.clk.Add(10 * time.Minute) // far past the claim lease
	second := schedulerWith(t, e.cfg, idx, e.clk)
	if n, err := second.ScanOnce(ctx); n != 0 || err != nil {
		t.Fatalf("second scan: sent %d, %v; want nothing", n, err)
	}
	if got := readTopic(t, e.brokers, e.mainTopic, 1, time.Second); len(got) != 1 {
		t.Fatalf("%d retries on the main topic, want 1", len(got))
	}
}

// warmUp scans while nothing is due until a scan succeeds: the first
// scan's index catch-up may meet a fresh DLQ topic before its partitions
// have leaders ("Not leader for partition").
func warmUp(t *testing.T, s *Scheduler) {
	t.Helper()
	for try := 0; ; try++ {
		n, err := s.ScanOnce(context.Background())
		if err == nil && n == 0 {
			return
		}
		if try == 50 {
			t.Fatalf("warm-up scan: %d %v", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// blockedUsers is a BlockLookup of fixed blocks.
type blockedUsers map[string]time.Time

func (b blockedUsers) BlockedUntil(_ context.Context, user string) (time.Time, bool, error) {
	until, ok := b[user]
	return until, ok, nil
}

// A rate_limited letter placed before its user's block was known (the
// refusals that led to the block) is due after its backoff; when it is due
// the user is still blocked. The scheduler holds it until a second past
// the block's end instead of re-injecting it into a refusal (user_blocked,
// a new letter: the DLQ grew instead of shrinking). Another user's letter
// goes at once; once the block ends the held ones go, in order.
func TestSchedulerHoldsLettersOfABlockedUser(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk, idx, unaware := indexRig(rdb, prefix) // placement did not know of the block
	ctx := context.Background()
	var held []*chatmsg.DeadLetter
	for i := range 3 {
		dl := deadLetter("bot", ReasonRateLimited, int64(i), clk.Now())
		placeIndexed(t, ctx, idx, unaware, dl)
		held = append(held, dl)
	}
	other := deadLetter("person", ReasonRateLimited, 10, clk.Now())
	placeIndexed(t, ctx, idx, unaware, other)
	blockEnd := clk.Now().Add(time.Hour)
	cfg := testConfig(t, brokers, mainTopic, testenv.Topic(t, 2))
	pol := NewPolicy(testRecovery(), WithBlockLookup(blockedUsers{"bot": blockEnd}))
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: prefix},
		rdb, idx, pol, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	warmUp(t, s)
	clk.Add(time.Minute)
	if n, err := s.ScanOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first scan sent %d %v, want the other user's one", n, err)
	}
	for i, dl := range held {
		e, err := idx.Get(ctx, dl.ID)
		if err != nil || e.State == StateRetried {
			t.Fatalf("the blocked user's letter %d: %+v %v, want still due", i, e, err)
		}
	}
	clk.Add(blockEnd.Sub(clk.Now()) - time.Second)
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Fatalf("a second before the block's end sent %d", n)
	}
	delete(pol.strategies[ReasonRateLimited].(*blocked).lookup.(blockedUsers), "bot") // the block ended
	clk.Add(2*time.Second + 10*time.Millisecond)
	if n, err := s.ScanOnce(ctx); err != nil || n != 3 {
		t.Fatalf("after the block sent %d %v, want 3", n, err)
	}
	order := upstreamOrder(t, brokers, mainTopic, 4, "bot")
	if fmt.Sprint(order) != "[up-0 up-1 up-2]" {
		t.Fatalf("the held letters went in the order %v", order)
	}
}

// TestSchedulerKeepsAUsersOrderAcrossBackoffs: a user's first message
// failed again after its retry (it backs off longer), the second failed
// once, so the second falls due first. The scheduler holds it until the
// first is due and then sends both in the user's order; another user's
// letter is not held.
func TestSchedulerKeepsAUsersOrderAcrossBackoffs(t *testing.T) {
	f := newSchedFixture(t)
	brokers, mainTopic, idx, clk, put, ctx := f.brokers, f.mainTopic, f.idx, f.clk, f.put, context.Background()
	first := deadLetter("u", ReasonDownstreamError, 0, clk.Now())
	put(first)
	clk.Add(time.Second)
	put(deadLetter("u", ReasonDownstreamError, 1, clk.Now()))
	put(deadLetter("other", ReasonDownstreamError, 2, clk.Now()))
	// The first message's retry (offset 50) failed again: same letter,
	// retry count 1, due after a longer backoff.
	clk.Add(time.Second)
	again := chatmsg.NewDeadLetter(chatmsg.Source{Topic: "src-main", Partition: 1, Offset: 50, Timestamp: clk.Now(), Key: []byte("u"), Value: chat("u", 0),
		Headers: []chatmsg.Header{{Key: chatmsg.HeaderMsgType, Value: []byte("text")}, {Key: chatmsg.HeaderDLQID, Value: []byte(first.ID)},
			{Key: chatmsg.HeaderRetryCount, Value: []byte("1")}}}, ReasonDownstreamError, "test failure", clk.Now())
	put(again)
	if again.NextRetryTime == nil || !again.NextRetryTime.After(clk.Now().Add(time.Minute)) {
		t.Fatalf("the failed-again letter is due at %v, want a longer backoff than the second's", again.NextRetryTime)
	}

	s := newScheduler(t, brokers, mainTopic, idx, clk)
	warmUp(t, s)
	clk.Add(time.Minute)
	if n, err := s.ScanOnce(ctx); err != nil || n != 1 {
		t.Fatalf("with u's second letter due and its first not: sent %d %v, want other's letter only", n, err)
	}
	clk.Add(again.NextRetryTime.Sub(clk.Now()) + 10*time.Millisecond)
	if n, err := s.ScanOnce(ctx); err != nil || n != 2 {
		t.Fatalf("once u's first letter is due: sent %d %v, want both of u's", n, err)
	}
	order := upstreamOrder(t, brokers, mainTopic, 3, "u")
	if fmt.Sprint(order) != "[up-0 up-1]" {
		t.Fatalf("u's retries on the main topic in the order %v, want [up-0 up-1]", order)
	}
}

// upstreamOrder reads the n records of topic and returns the upstream
// msgids of key's, in the topic's order.
func upstreamOrder(t *testing.T, brokers, topic string, n int, key string) []string {
	t.Helper()
	var order []string
	for _, m := range readTopic(t, brokers, topic, n, 200*time.Millisecond) {
		if string(m.Key) == key {
			cm, err := chatmsg.Decode(m.Value)
			if err != nil {
				t.Fatal(err)
			}
			order = append(order, cm.UpstreamMsgID)
		}
	}
	return order
}

// schedFixture is a scheduler test's topic, index, clock and placement:
// put places a dead letter under the test recovery policy and indexes it.
type schedFixture struct {
	brokers, mainTopic string
	clk                *manualClock
	idx                *Index
	put                func(*chatmsg.DeadLetter)
}

func newSchedFixture(t *testing.T) schedFixture {
	f := schedFixture{brokers: testenv.KafkaBrokers(t), mainTopic: testenv.Topic(t, 1), clk: newClock()}
	rdb, prefix := testenv.Redis(t)
	f.idx = NewIndex(rdb, prefix, WithClock(f.clk), WithLetters(mem))
	pol := NewPolicy(testRecovery())
	f.put = func(dl *chatmsg.DeadLetter) {
		t.Helper()
		pol.Place(context.Background(), dl)
		if _, err := indexDL(t, context.Background(), f.idx, dl); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
