package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func TestSendDurableInTopic(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 2)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := testConfig(t, brokers, "unused-main", topic)
	reg := prometheus.NewRegistry()
	p, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ}, WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	dls := []*chatmsg.DeadLetter{
		deadLetter("alice", ReasonRateLimited, 10, now),
		deadLetter("alice", ReasonDownstreamError, 11, now),
		deadLetter("bob", ReasonInvalidMessage, 12, now),
	}
	for _, dl := range dls {
		sendSync(t, p, dl)
	}
	closeProducer(t, p)
	if got := testenv.MetricValue(p.m.produced.WithLabelValues("rate_limited")); got != 1 {
		t.Errorf("produced{rate_limited} = %v, want 1", got)
	}
	if got := testenv.MetricValue(p.m.emergencyWrites); got != 0 {
		t.Errorf("emergency writes = %v, want 0", got)
	}
	msgs := readTopic(t, brokers, topic, 3, 200*time.Millisecond)
	if len(msgs) != 3 {
		t.Fatalf("got %d records, want 3", len(msgs))
	}
	byID := map[string]*chatmsg.DeadLetter{}
	for _, dl := range dls {
		byID[dl.ID] = dl
	}
	partOf := map[string]int32{}
	for _, m := range msgs {
		got, err := Decode(m.Value)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		want := byID[got.ID]
		if want == nil {
			t.Fatalf("unexpected ID %s", got.ID)
		}
		if string(m.Key) != want.UserID {
			t.Errorf("key %q, want %q", m.Key, want.UserID)
		}
		if header(m, HeaderReason) != string(want.Reason) || header(m, HeaderUser) != want.UserID ||
			header(m, HeaderSource) != "src-main/1/"+strconv.FormatInt(want.SourceOffset, 10) || header(m, HeaderDLQID) != want.ID {
			t.Errorf("headers %v for %s", m.Headers, want.ID)
		}
		if !bytes.Equal(got.OriginalValue, want.OriginalValue) || got.Original == nil || got.Original.ExternalUserID != want.UserID {
			t.Errorf("original message not kept whole: %+v", got)
		}
		if p, ok := partOf[want.UserID]; ok && p != m.TopicPartition.Partition {
			t.Errorf("user %s spread over partitions %d and %d", want.UserID, p, m.TopicPartition.Partition)
		}
		partOf[want.UserID] = m.TopicPartition.Partition
	}
}

// Kafka unreachable: every dead letter is fsync'd to the emergency file
// (0600 in a 0700 dir) and reported durable; a producer on the real broker
// replays them into the topic and empties the file.
func TestEmergencyFileAndReplay(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 2)
	cfg := testConfig(t, "127.0.0.1:1", "unused-main", topic)
	cfg.DLQ.ProduceTimeout = 300 * time.Millisecond
	cfg.DLQ.BreakerFailures = 2
	cfg.DLQ.BreakerOpen = time.Minute
	reg := prometheus.NewRegistry()
	down, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ}, WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	var dls []*chatmsg.DeadLetter
	for i := range 5 {
		dl := deadLetter("carol", ReasonQueueFull, int64(100+i), now)
		dls = append(dls, dl)
		sendSync(t, down, dl) // done(nil) only after fsync
	}
	if got := testenv.MetricValue(down.m.emergencyWrites); got != 5 {
		t.Errorf("emergency writes = %v, want 5", got)
	}
	if got := testenv.MetricValue(down.m.produced.WithLabelValues("queue_full")); got != 0 {
		t.Errorf("produced = %v, want 0", got)
	}
	closeProducer(t, down)

	st, err := os.Stat(cfg.DLQ.EmergencyFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("emergency file mode %v, want 0600", st.Mode().Perm())
	}
	if dst, _ := os.Stat(filepath.Dir(cfg.DLQ.EmergencyFile)); dst.Mode().Perm() != 0o700 {
		t.Errorf("emergency dir mode %v, want 0700", dst.Mode().Perm())
	}
	body, _ := os.ReadFile(cfg.DLQ.EmergencyFile)
	lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("emergency file has %d lines, want 5", len(lines))
	}
	for i, l := range lines {
		dl, err := Decode([]byte(l))
		if err != nil || dl.ID != dls[i].ID {
			t.Fatalf("line %d: %v %+v", i, err, dl)
		}
	}

	// Back online: the replay loop moves the file into the topic.
	cfg.Kafka.Brokers = brokers
	cfg.DLQ.ReplayInterval = 50 * time.Millisecond
	up, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, up)
	testenv.Eventually(t, 20*time.Second, func() error {
		pending, err := up.EmergencyPending()
		return testenv.Check(err == nil && !pending, "emergency file replayed")
	})
	if st, _ := os.Stat(cfg.DLQ.EmergencyFile); st.Size() != 0 {
		t.Errorf("emergency file not truncated: %d bytes", st.Size())
	}
	msgs := readTopic(t, brokers, topic, 5, 300*time.Millisecond)
	seen := map[string]int{}
	for _, m := range msgs {
		dl, err := Decode(m.Value)
		if err != nil {
			t.Fatal(err)
		}
		seen[dl.ID]++
		if string(m.Key) != "carol" {
			t.Errorf("key %q", m.Key)
		}
	}
	for _, dl := range dls {
		if seen[dl.ID] != 1 {
			t.Errorf("%s replayed %d times, want 1", dl.ID, seen[dl.ID])
		}
	}
}

// A crash mid-write leaves a torn last line: it is terminated on open,
// skipped and counted at replay, and the records around it survive.
func TestEmergencyTornLine(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 1)
	cfg := testConfig(t, brokers, "unused-main", topic)
	now := time.Now().UTC()
	first, second := deadLetter("dave", ReasonCircuitOpen, 1, now), deadLetter("dave", ReasonCircuitOpen, 2, now)
	b1, _ := Encode(first)
	b2, _ := Encode(second)
	if err := os.MkdirAll(filepath.Dir(cfg.DLQ.EmergencyFile), 0o700); err != nil {
		t.Fatal(err)
	}
	torn := append(append([]byte{}, b1...), '\n')
	torn = append(torn, b2[:len(b2)/2]...) // crash in the middle of the second record
	if err := os.WriteFile(cfg.DLQ.EmergencyFile, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	// A record appended after the torn one must not be glued to it.
	third := deadLetter("dave", ReasonCircuitOpen, 3, now)
	b3, _ := Encode(third)
	if err := p.em.append([][]byte{b3}); err != nil {
		t.Fatal(err)
	}
	n, err := p.ReplayOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("replayed %d, want 2", n)
	}
	if got := testenv.MetricValue(p.m.tornLines); got != 1 {
		t.Errorf("torn lines = %v, want 1", got)
	}
	msgs := readTopic(t, brokers, topic, 2, 200*time.Millisecond)
	ids := map[string]bool{}
	for _, m := range msgs {
		dl, _ := Decode(m.Value)
		ids[dl.ID] = true
	}
	if len(msgs) != 2 || !ids[first.ID] || !ids[third.ID] {
		t.Errorf("topic holds %v, want %s and %s", ids, first.ID, third.ID)
	}
	if pending, _ := p.EmergencyPending(); pending {
		t.Error("emergency file still pending")
	}
}

// Replay progress is kept in the sidecar: after a partial replay a new
// producer resumes at the right record.
func TestEmergencyOffsetSidecar(t *testing.T) {
	dir := t.TempDir()
	e, err := openEmergencyFile(filepath.Join(dir, "x", "e.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var lines [][]byte
	for i := range 4 {
		b, _ := Encode(deadLetter("erin", ReasonQueueFull, int64(i), now))
		lines = append(lines, b)
	}
	if err := e.append(lines); err != nil {
		t.Fatal(err)
	}
	recs, err := e.readBatch(2, 1<<20)
	if err != nil || len(recs) != 2 {
		t.Fatalf("batch %d %v", len(recs), err)
	}
	if err := e.commit(recs[1].end); err != nil {
		t.Fatal(err)
	}
	_ = e.close()
	e2, err := openEmergencyFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	recs, err = e2.readBatch(10, 1<<20)
	if err != nil || len(recs) != 2 || recs[0].dl.SourceOffset != 2 || recs[1].dl.SourceOffset != 3 {
		t.Fatalf("resumed batch %+v %v", recs, err)
	}
	if err := e2.commit(recs[1].end); err != nil {
		t.Fatal(err)
	}
	if pending, _ := e2.pending(); pending {
		t.Error("still pending after full commit")
	}
	if st, _ := os.Stat(e.path); st.Size() != 0 {
		t.Errorf("file not truncated: %d", st.Size())
	}
}

// TestEmergencyFileLocked: a second open of the same emergency file (as by
// a second process pointed at the same path) is refused with an error that
// names the file, until the first one is closed. Without the lock, both
// appended to the file and each one's replay truncated the other's
// fsync'd records.
func TestEmergencyFileLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "e.jsonl")
	e, err := openEmergencyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openEmergencyFile(path)
	if !errors.Is(err, ErrEmergencyFileInUse) || !strings.Contains(err.Error(), path) {
		t.Fatalf("second open: %v, want ErrEmergencyFileInUse naming %s", err, path)
	}
	if err := e.close(); err != nil {
		t.Fatal(err)
	}
	e2, err := openEmergencyFile(path)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	_ = e2.close()
}

// TestEmergencyReplayOnFullDisk: the emergency file's filesystem is full
// when Kafka is back (the file filled it). The replay cannot rewrite its
// offset sidecar, yet it replays every record, in batches, and truncates
// the file, which frees the disk. Before, the sidecar's failed write
// stopped the replay after its first batch, which it then sent again and
// again, never reaching the records after it.
func TestEmergencyReplayOnFullDisk(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, 2)
	dir := testenv.Tmpfs(t, "4m")
	cfg := testConfig(t, "127.0.0.1:1", "unused-main", topic)
	cfg.DLQ.EmergencyFile = filepath.Join(dir, "dlq.jsonl")
	cfg.DLQ.ProduceTimeout = 300 * time.Millisecond
	cfg.DLQ.BreakerFailures = 1
	cfg.DLQ.BreakerOpen = time.Minute
	down, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1200 // more than two replay batches of 500
	now := time.Now().UTC()
	for i := range n {
		sendSync(t, down, deadLetter(fmt.Sprintf("u%d", i%9), ReasonQueueFull, int64(i), now))
	}
	closeProducer(t, down)
	if _, err := testenv.FillDisk(dir); err != nil {
		t.Fatal(err)
	}

	cfg.Kafka.Brokers = brokers
	up, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, up)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	replayed, err := up.ReplayOnce(ctx)
	if err != nil || replayed != n {
		t.Fatalf("replayed %d, %v; want all %d", replayed, err, n)
	}
	if pending, err := up.EmergencyPending(); err != nil || pending {
		t.Fatalf("pending %v %v after the replay", pending, err)
	}
	if st, err := os.Stat(cfg.DLQ.EmergencyFile); err != nil || st.Size() != 0 {
		t.Fatalf("emergency file not truncated: %v %v", st, err)
	}
	if got := readTopic(t, brokers, topic, n, 500*time.Millisecond); len(got) < n {
		t.Fatalf("%d records in the DLQ topic, want %d", len(got), n)
	}
}
