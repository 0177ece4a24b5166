package dlq

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// slowIndex is a go-redis hook that delays each index write, so a Rebuild
// takes long enough for a scheduler scanning every 10 ms to see whatever
// the rebuild leaves due on the way.
type slowIndex struct{ delay time.Duration }

func (slowIndex) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s slowIndex) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[1] == indexScript.Hash() {
			time.Sleep(s.delay)
		}
		return next(ctx, cmd)
	}
}
func (slowIndex) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRebuildBesideSchedulerResendsNothing: three dead letters, long due,
// each settled by an event far behind it in the DLQ topic — one retried,
// one moved to review by an operator, one purged — with 300 records (not
// due) in between. A Rebuild, slowed down, runs while a scheduler scans
// every 10 ms: no record may reach the main topic, and the three end as
// they were. Before, the rebuild indexed each letter as due the moment it
// read it and the scheduler re-sent all three before the rebuild reached
// their events.
func TestRebuildBesideSchedulerResendsNothing(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	p, err := NewProducer(ProducerConfig{Kafka: e.cfg.Kafka, DLQ: e.cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	long := e.clk.Now().Add(-2 * time.Hour) // due long ago
	settled := map[string]*chatmsg.DeadLetter{}
	for i, name := range []string{"retried", "reviewed", "purged"} {
		dl := deadLetter("u-"+name, ReasonDownstreamError, int64(i), long)
		dl.EnsureID()
		settled[name] = dl
		sendSync(t, p, dl)
	}
	for i := range 300 {
		sendSync(t, p, deadLetter(fmt.Sprintf("filler-%d", i%7), ReasonInvalidMessage, int64(100+i), long))
	}
	ev := func(dl *chatmsg.DeadLetter, event string) *chatmsg.DeadLetter {
		return &chatmsg.DeadLetter{ID: dl.ID, Event: event, Reason: dl.Reason, UserID: dl.UserID,
			OriginalKey: dl.OriginalKey, FailureTime: e.clk.Now()}
	}
	retried := ev(settled["retried"], EventRetried)
	retried.Attempts = 1
	sendSync(t, p, retried)
	moved := ev(settled["reviewed"], EventMoved)
	moved.ManualReview = true
	sendSync(t, p, moved)
	sendSync(t, p, ev(settled["purged"], EventPurged))

	slow := redis.NewClient(e.rdb.Options())
	slow.AddHook(slowIndex{delay: 3 * time.Millisecond})
	defer slow.Close()
	idx := NewIndex(slow, e.prefix, WithClock(e.clk), WithLetters(topicLetters(t, e.cfg)))
	c, err := NewConsumer(ConsumerConfig{Kafka: e.cfg.Kafka}, idx, NewPolicy(testRecovery()), WithClock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	s := schedulerWith(t, e.cfg, NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(topicLetters(t, e.cfg))), e.clk)
	// No DLQ consumer runs here to commit its progress: the index is as
	// caught up as the rebuild makes it, so the scheduler scans at once.
	s.catchUp.Store(false)
	var scans atomic.Int64
	stop := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_, _ = s.ScanOnce(ctx)
			scans.Add(1)
		}
	}()
	n, err := c.Rebuild(ctx)
	close(stop)
	<-scanned
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rebuild applied %d records during %d scheduler scans", n, scans.Load())
	if got := readTopic(t, e.brokers, e.mainTopic, 0, 2*time.Second); len(got) != 0 {
		t.Fatalf("%d records reached the main topic during the rebuild (re-sent settled letters)", len(got))
	}
	if en, err := idx.Get(ctx, settled["retried"].ID); err != nil || en.State != StateRetried {
		t.Fatalf("retried letter after rebuild: %+v %v", en, err)
	}
	if en, err := idx.Get(ctx, settled["reviewed"].ID); err != nil || en.State != StateReview {
		t.Fatalf("reviewed letter after rebuild: %+v %v", en, err)
	}
	if _, err := idx.Get(ctx, settled["purged"].ID); err == nil {
		t.Fatal("purged letter came back with the rebuild")
	}
	// A letter with no settling event is due again once the rebuild ended.
	open := deadLetter("u-open", ReasonDownstreamError, 9, long)
	open.EnsureID()
	sendSync(t, p, open)
	if _, err := c.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if en, err := idx.Get(ctx, open.ID); err != nil || en.State != StateDue || en.NextRetryTime == nil ||
		en.NextRetryTime.Year() > 3000 {
		t.Fatalf("unsettled letter after rebuild: %+v %v, want due at its time", en, err)
	}
	if due, _ := e.rdb.ZScore(ctx, e.prefix+"dlq:due", open.ID).Result(); int64(due) >= parkedScore {
		t.Fatalf("unsettled letter still parked (score %v)", due)
	}
}

// TestUndecodableIndexEntrySkipped: one index entry whose DLQ coordinates
// do not parse does not fail the scan's batch: it is moved to review and
// counted, and the others are sent. A second whose letter the topic no
// longer holds (retention) goes to review too, counted as gone.
func TestUndecodableIndexEntrySkipped(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	idx := NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(mem))
	long := e.clk.Now().Add(-2 * time.Hour)
	var ids []string
	var gone Coord
	for i := range 4 {
		dl := deadLetter(fmt.Sprintf("u%d", i), ReasonDownstreamError, int64(i), long)
		NewPolicy(testRecovery()).Place(ctx, dl)
		dl.EnsureID()
		at := mem.put(t, dl)
		if _, err := idx.Index(ctx, dl, at); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			gone = at
		}
		ids = append(ids, dl.ID)
	}
	if err := e.rdb.HSet(ctx, idx.msgKey(ids[1]), "k", "garbled").Err(); err != nil {
		t.Fatal(err)
	}
	mem.forget(gone)
	s := newScheduler(t, e.brokers, e.mainTopic, idx, e.clk)
	sent, err := s.ScanOnce(ctx)
	if err != nil || sent != 2 {
		t.Fatalf("scan sent %d, %v; want the 2 good entries", sent, err)
	}
	for _, id := range []string{ids[1], ids[3]} {
		if en, err := idx.Get(ctx, id); err != nil || en.State != StateReview {
			t.Fatalf("entry %s: %+v %v, want review", id, en, err)
		}
	}
	if v := testenv.MetricValue(idx.m.undecodableEntries); v != 1 {
		t.Fatalf("undecodable entries = %v", v)
	}
	if v := testenv.MetricValue(idx.m.gone); v != 1 {
		t.Fatalf("letters gone = %v", v)
	}
}

// TestBatchRetryKeepsUserOrder: an operator's batch retry of one user's 20
// letters (all failed at the same moment, so all due together) puts them
// back on the main topic in the order of their messages, and each entry
// then counts one retry. Before, equal due times made the scheduler take
// them in ID (hash) order: [0,1,2,3,4,8,14,17,15,19,5,…] in the field.
func TestBatchRetryKeepsUserOrder(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	idx := NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(mem))
	at := e.clk.Now()
	var entries []*Entry
	for off := range 20 {
		dl := deadLetter("ordered", ReasonDownstreamError, int64(off), at)
		dl.ManualReview = true // in review; the operator retries them all
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
		en, err := idx.Get(ctx, dl.ID)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, en)
	}
	// The listing order (by ID) is what the operator's filter hands over.
	slices.SortFunc(entries, func(a, b *Entry) int { return cmp.Compare(a.ID, b.ID) })
	if n, err := idx.RequeueInOrder(ctx, entries, e.clk.Now()); err != nil || n != 20 {
		t.Fatalf("requeued %d, %v", n, err)
	}
	s := newScheduler(t, e.brokers, e.mainTopic, idx, e.clk)
	e.clk.Add(time.Second)
	sent := 0
	for range 10 {
		n, err := s.ScanOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sent += n; sent == 20 {
			break
		}
		// The scheduler paces one user's retries (15 a minute under the
		// shipped normal group): the rest go at the user's next window.
		e.clk.Add(time.Minute + time.Second)
	}
	msgs := readTopic(t, e.brokers, e.mainTopic, 20, 500*time.Millisecond)
	var got []int
	for _, m := range msgs {
		var n int
		fmt.Sscanf(string(chatmsgUpstream(t, m.Value)), "up-%d", &n)
		got = append(got, n)
	}
	if !slices.IsSorted(got) || len(got) != 20 {
		t.Fatalf("re-injected in order %v, want 0..19", got)
	}
	for _, en := range entries {
		if g, err := idx.Get(ctx, en.ID); err != nil || g.State != StateRetried || g.Attempts != 1 {
			t.Fatalf("entry after retry: %+v %v", g, err)
		}
	}
}

func chatmsgUpstream(t *testing.T, v []byte) string {
	t.Helper()
	m, err := chatmsg.Decode(v)
	if err != nil {
		t.Fatal(err)
	}
	return m.UpstreamMsgID
}

// TestRebuildCollapsesAMessagesLetters: a message dead-lettered, retried,
// failed again, retried and failed a third time has three records in the
// DLQ topic (and two retried events); a rebuild makes them one letter —
// the newest failure, due at its real time, its history counted — and a
// message whose retry was done stays done.
func TestRebuildCollapsesAMessagesLetters(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	p, err := NewProducer(ProducerConfig{Kafka: e.cfg.Kafka, DLQ: e.cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	pol := NewPolicy(testRecovery())
	first := e.clk.Now().Add(-10 * time.Minute)
	ev := func(dl *chatmsg.DeadLetter, event string, attempts int) *chatmsg.DeadLetter {
		return &chatmsg.DeadLetter{ID: dl.ID, Event: event, Reason: dl.Reason, UserID: dl.UserID, Attempts: attempts,
			OriginalKey: dl.OriginalKey, FailureTime: e.clk.Now()}
	}
	// failAgain is the retried message refused again at the main topic's offset off.
	failAgain := func(dl *chatmsg.DeadLetter, reason Reason, off int64, at time.Time) *chatmsg.DeadLetter {
		rec, err := pol.Strategy(dl.Reason).PrepareRetry(dl)
		if err != nil {
			t.Fatal(err)
		}
		return chatmsg.NewDeadLetter(chatmsg.Source{Topic: "src-main", Partition: 1, Offset: off, Timestamp: at, Key: rec.Key, Value: rec.Value,
			Headers: rec.Headers}, reason, "refused again", at)
	}
	msg := deadLetter("u-many", ReasonDownstreamError, 1, first)
	second := failAgain(msg, ReasonRateLimited, 700, first.Add(time.Minute))
	third := failAgain(second, ReasonDownstreamError, 800, first.Add(2*time.Minute))
	done := deadLetter("u-done", ReasonDownstreamError, 2, first)
	done.EnsureID()
	for _, r := range []*chatmsg.DeadLetter{msg, ev(msg, EventRetried, 1), second, ev(msg, EventRetried, 2), third,
		done, ev(done, EventRetried, 1), ev(done, EventDone, 0)} {
		sendSync(t, p, r)
	}
	if third.ID != msg.ID || second.ID != msg.ID {
		t.Fatalf("the message's records have IDs %s, %s, %s: want one", msg.ID, second.ID, third.ID)
	}
	idx := NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(topicLetters(t, e.cfg)))
	c, err := NewConsumer(ConsumerConfig{Kafka: e.cfg.Kafka}, idx, pol, WithClock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second rebuild ends the same
		if _, err := c.Rebuild(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := idx.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Total != 2 || st.Due != 1 || st.Done != 1 || st.Retried != 0 || st.ByReason["downstream_error"] != 2 {
			t.Fatalf("after rebuild: %+v, want 2 letters: one due, one done", st)
		}
		en, err := idx.Get(ctx, msg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if en.State != StateDue || en.NextRetryTime == nil || en.NextRetryTime.Year() > 3000 || en.Failures != 3 ||
			en.Attempts != 2 || en.RetryCount != 2 || en.SourceOffset != 800 || en.FirstFailure == nil || !en.FirstFailure.Equal(first) {
			t.Fatalf("the message's letter after rebuild: state %s due %v failures %d attempts %d retry %d source %d first %v",
				en.State, en.NextRetryTime, en.Failures, en.Attempts, en.RetryCount, en.SourceOffset, en.FirstFailure)
		}
		if en, err := idx.Get(ctx, done.ID); err != nil || en.State != StateDone {
			t.Fatalf("done letter after rebuild: %+v %v", en, err)
		}
	}
}
