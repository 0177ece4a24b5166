package archive

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func kafkaCfg(brokers, main, dlqTopic string) config.Kafka {
	k := config.Kafka{Brokers: brokers, ClientID: "kfpipe-archive-test", Overrides: map[string]string{}}
	k.Topics.Main.Name, k.Topics.DLQ.Name = main, dlqTopic
	k.Consumer.AutoOffsetReset = "earliest"
	k.Consumer.SessionTimeout = 10 * time.Second
	k.Consumer.MaxPollInterval = 5 * time.Minute
	k.Consumer.FetchMaxBytes = 52428800
	return k
}

func msg(user string, i int, at time.Time) *chatmsg.ChatMessage {
	return &chatmsg.ChatMessage{MessageID: int64(i + 1), UpstreamMsgID: fmt.Sprintf("%s-m%04d", user, i), OpenKfID: "wkTEST",
		ExternalUserID: user, MsgType: "text", Origin: 3, SendTime: at.Unix(),
		Content: []byte(fmt.Sprintf(`{"text":{"content":"hello %d"}}`, i))}
}

func records(t *testing.T, ms []*chatmsg.ChatMessage) []testenv.Record {
	var recs []testenv.Record
	for _, m := range ms {
		v, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, testenv.Record{Key: []byte(m.ExternalUserID), Value: v})
	}
	return recs
}

// runArchiver runs an archiver until the returned stop is called.
func runArchiver(t *testing.T, k config.Kafka, cfg config.Archive, s *Store, reg prometheus.Registerer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewArchiver(k, cfg, s, nil, reg).Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("archiver: %v", err)
		}
	}
}

// Every message and dead letter on the topics is archived exactly once:
// through a stop and restart of the archiver, through re-pulled copies of
// messages (new offsets, same msgid), and through a second group that
// re-reads both topics from the start (an archiver whose commits were all
// lost). The three readers answer from the rows.
func TestArchiverExactlyOnce(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	dsn := testenv.Postgres(t)
	main, dlqTopic := testenv.Topic(t, 3), testenv.Topic(t, 2)
	k := kafkaCfg(brokers, main, dlqTopic)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cfg := config.Archive{GroupID: testenv.Name(t, "g"), BatchSize: 50, FlushInterval: 50 * time.Millisecond}

	// Users' messages spread over three days (three partitions of the
	// table), the oldest 2 days ago.
	now := time.Now().UTC().Truncate(time.Second)
	users := []string{"alice", "bob", "carol"}
	var first, second []*chatmsg.ChatMessage
	for i := range 300 {
		u := users[i%3]
		m := msg(u, i, now.Add(-48*time.Hour).Add(time.Duration(i)*9*time.Minute))
		if i < 150 {
			first = append(first, m)
		} else {
			second = append(second, m)
		}
	}
	testenv.Produce(t, brokers, main, records(t, first))
	reg := prometheus.NewRegistry()
	stop := runArchiver(t, k, cfg, s, reg)
	waitRows(t, s, users, 150)
	stop()
	for name, want := range map[string]float64{"kfpipe_archive_records_total": 150, "kfpipe_archive_rows_new_total": 150} {
		if v, _ := testenv.Gathered(t, reg, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}

	// The second half, re-pulled copies of 20 of the first (new Snowflake
	// ids, same upstream msgid), and dead letters of 5 messages, 2 of
	// them failing twice.
	dup := make([]*chatmsg.ChatMessage, 0, 20)
	for _, m := range first[:20] {
		c := *m
		c.MessageID += 10000
		dup = append(dup, &c)
	}
	testenv.Produce(t, brokers, main, records(t, append(second, dup...)))
	var letters []testenv.Record
	for i, m := range first[:5] {
		for retry := range 1 + i%2 {
			dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: main, Partition: 0, Offset: int64(i)}, deadletter.DownstreamError, "boom", now)
			dl.Original, dl.RetryCount = m, retry
			dl.EnsureID()
			b, err := dlq.Encode(dl)
			if err != nil {
				t.Fatal(err)
			}
			letters = append(letters, testenv.Record{Key: []byte(m.ExternalUserID), Value: b})
		}
	}
	testenv.Produce(t, brokers, dlqTopic, letters)
	stop = runArchiver(t, k, cfg, s, nil)
	waitRows(t, s, users, 300)
	waitProgress(t, s, dlqTopic, int64(len(letters)))
	stop()

	// A group that lost every commit re-reads all of it.
	cfg2 := cfg
	cfg2.GroupID = testenv.Name(t, "g2")
	stop = runArchiver(t, k, cfg2, s, nil)
	waitProgress(t, s, main, 320)
	waitProgress(t, s, dlqTopic, int64(len(letters)))
	stop()

	for _, m := range append(first, second...) {
		if n, err := s.Count(ctx, m.UpstreamMsgID, KindMessage); err != nil || n != 1 {
			t.Fatalf("message %s archived %d times (%v), want once", m.UpstreamMsgID, n, err)
		}
	}
	for i, m := range first[:5] {
		if n, err := s.Count(ctx, m.UpstreamMsgID, KindDeadLetter); err != nil || n != 1+i%2 {
			t.Fatalf("dead letters of %s archived: %d (%v), want %d", m.UpstreamMsgID, n, err, 1+i%2)
		}
	}

	// The three questions.
	rows, more, err := s.Conversation(ctx, "alice", now.Add(-49*time.Hour), now.Add(time.Hour), 1000)
	if err != nil || more {
		t.Fatal(err, more)
	}
	var alice int
	for i, r := range rows {
		if r.Kind == KindMessage {
			alice++
		}
		if i > 0 && r.At.Before(rows[i-1].At) {
			t.Fatalf("conversation not in order at %d: %s before %s", i, r.At, rows[i-1].At)
		}
	}
	if alice != 100 {
		t.Fatalf("alice's conversation has %d messages, want 100", alice)
	}
	got, err := s.Message(ctx, first[0].UpstreamMsgID)
	if err != nil || len(got) != 2 || got[0].Kind != KindMessage || got[1].Kind != KindDeadLetter || got[1].Reason != string(deadletter.DownstreamError) {
		t.Fatalf("message %s: %+v (%v), want the message and its dead letter", first[0].UpstreamMsgID, got, err)
	}
	if string(got[0].Content) != `{"text":{"content":"hello 0"}}` {
		t.Fatalf("content %s", got[0].Content)
	}
	recent, err := s.Account(ctx, "wkTEST", now.Add(-time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, m := range append(first, second...) {
		if m.SendTime >= now.Add(-time.Hour).Unix() {
			want++
		}
	}
	if len(recent) != want {
		t.Fatalf("account's last hour: %d messages, want %d", len(recent), want)
	}
	// Bob's last 3 turns before his newest message, which is left out.
	newest := second[len(second)-2]
	turns, err := s.LastTurns(ctx, "wkTEST", "bob", time.Unix(newest.SendTime, 0), newest.UpstreamMsgID, 3)
	if err != nil || len(turns) != 3 || turns[2].MsgID != second[len(second)-5].UpstreamMsgID ||
		turns[0].MsgID != second[len(second)-11].UpstreamMsgID {
		t.Fatalf("bob's last turns: %+v (%v)", turns, err)
	}
}

// waitRows waits until the users' conversations hold n messages in all.
func waitRows(t *testing.T, s *Store, users []string, n int) {
	t.Helper()
	testenv.Eventually(t, 45*time.Second, func() error {
		total := 0
		for _, u := range users {
			rows, _, err := s.Conversation(context.Background(), u, time.Now().Add(-72*time.Hour), time.Now().Add(time.Hour), 10000)
			if err != nil {
				return err
			}
			for _, r := range rows {
				if r.Kind == KindMessage {
					total++
				}
			}
		}
		return testenv.Check(total == n, "%d messages archived, want %d", total, n)
	})
}

// Day partitions past the retention are dropped; a row older than the
// retention is not written.
func TestRetentionDropsPartitions(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, 3*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	var rows []Row
	for d := range 3 {
		m := msg("dave", d, now.Add(-time.Duration(d)*24*time.Hour))
		rows = append(rows, FromMessage(m, 0, int64(d), now))
	}
	rows = append(rows, FromMessage(msg("dave", 9, now.Add(-80*time.Hour)), 0, 9, now)) // past the retention
	if n, err := s.Write(ctx, rows, nil); err != nil || n != 3 {
		t.Fatalf("wrote %d (%v), want 3", n, err)
	}
	// Two days later the partitions of 12-04 and 12-05 are past 3 days.
	now = now.Add(48 * time.Hour)
	dropped, err := s.DropExpired(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dropped) != "[kf_archive_p20261204]" {
		t.Fatalf("dropped %v, want [kf_archive_p20261204]", dropped)
	}
	got, _, err := s.Conversation(ctx, "dave", now.Add(-10*24*time.Hour), now, 100)
	if err != nil || len(got) != 2 {
		t.Fatalf("after the drop: %d rows (%v), want 2", len(got), err)
	}
}

// waitProgress waits until the archiver has read n records of topic.
func waitProgress(t *testing.T, s *Store, topic string, n int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		ps, err := s.Progress(context.Background(), topic)
		if err != nil {
			return err
		}
		var sum int64
		for _, p := range ps {
			sum += p.NextOffset
		}
		return testenv.Check(sum >= n, "%s archived up to %d of %d records", topic, sum, n)
	})
}
