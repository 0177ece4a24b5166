package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// prefetchLimiter allows everything and records, per user, whether Allow
// came before any Prefetch of that user.
type prefetchLimiter struct {
	mu           sync.Mutex
	prefetched   map[string]bool
	allows       map[string]int
	unprefetched []string
}

func (l *prefetchLimiter) Prefetch(_ context.Context, users []string, _ time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range users {
		l.prefetched[u] = true
	}
}

func (l *prefetchLimiter) Allow(_ context.Context, user string, _ time.Time) Verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.prefetched[user] {
		l.unprefetched = append(l.unprefetched, user)
	}
	l.allows[user]++
	return Verdict{Allowed: true}
}

// TestRoutingByKey: records are routed by their Kafka key and decoded in
// the actor. A keyed record that cannot be decoded is invalid_message filed
// under its key (and still went through breaker and limiter, as the user's
// message); a record without key is decoded by the dispatcher and routed by
// its external_userid; a payload whose external_userid differs from the key
// is handled by the key's actor, and its dead letter (here: a permanent
// handler error) names both. The limiter's Prefetch sees each user before
// Allow does.
func TestRoutingByKey(t *testing.T) {
	topic := testenv.Topic(t, 1)
	enc := func(m *chatmsg.ChatMessage) []byte {
		b, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mismatched := chat("other", 1)
	recs := [][2][]byte{
		{[]byte("k1"), enc(chat("k1", 0))},
		{nil, enc(chat("nokey", 0))},
		{[]byte("k1"), enc(chat("k1", 1))},
		{[]byte("k2"), enc(chat("other", 0))},
		{nil, []byte(`{"open_kfid": nope`)},
		{[]byte("k3"), []byte(`<xml/>`)},
		{[]byte("k1"), enc(chat("k1", 2))},
		{[]byte("k2"), enc(mismatched)},
		{nil, enc(chat("nokey", 1))},
	}
	produceRaw(t, topic, recs)
	cfg := testConfig(t, topic)
	var mu sync.Mutex
	var handled []string // upstream msgids in handling order
	lim := &prefetchLimiter{prefetched: map[string]bool{}, allows: map[string]int{}}
	br := &fakeBreaker{}
	dlq := &memDLQ{}
	c := startConsumer(t, cfg, HandlerFunc(func(_ context.Context, m *chatmsg.ChatMessage) error {
		if m.UpstreamMsgID == mismatched.UpstreamMsgID {
			return handler.Permanent(errors.New("refused by business"))
		}
		mu.Lock()
		handled = append(handled, m.UpstreamMsgID)
		mu.Unlock()
		return nil
	}), dlq, WithLimiter(lim), WithBreaker(br))
	waitCommitted(t, 30*time.Second, cfg.Kafka.Consumer.GroupID, topic, int64(len(recs)))
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d", c.InFlight())
	}

	mu.Lock()
	got := slices.Clone(handled)
	mu.Unlock()
	var k1 []string
	for _, id := range got {
		if strings.Contains(id, "-k1-") {
			k1 = append(k1, id)
		}
	}
	if want := []string{"msg-k1-000000", "msg-k1-000001", "msg-k1-000002"}; !slices.Equal(k1, want) {
		t.Fatalf("k1 handled %v, want %v in order", k1, want)
	}
	if len(got) != 6 { // k1 ×3, nokey ×2, k2's first
		t.Fatalf("handled %v, want 6 messages", got)
	}

	lim.mu.Lock()
	allows, unprefetched := lim.allows, lim.unprefetched
	lim.mu.Unlock()
	if want := map[string]int{"k1": 3, "nokey": 2, "k2": 2, "k3": 1}; !maps.Equal(allows, want) {
		t.Fatalf("limiter decided %v, want %v (routed by key; no-key records by external_userid)", allows, want)
	}
	if len(unprefetched) != 0 {
		t.Fatalf("Allow before Prefetch for %v", unprefetched)
	}
	if ok, failed := br.ok.Load(), br.failed.Load(); ok != 7 || failed != 1 {
		t.Fatalf("breaker outcomes ok=%d failed=%d, want 7 and 1 (the permanent error)", ok, failed)
	}

	letters := dlq.all()
	if len(letters) != 3 {
		t.Fatalf("%d dead letters, want 3: %+v", len(letters), letters)
	}
	byOffset := map[int64]*chatmsg.DeadLetter{}
	for _, l := range letters {
		byOffset[l.SourceOffset] = l
		// The undecodable records are invalid_message; the handler's
		// permanent error (offset 7) is handler_rejected.
		want := ReasonInvalidMessage
		if l.SourceOffset == 7 {
			want = ReasonHandlerRejected
		}
		if string(l.Reason) != want {
			t.Fatalf("dead letter %+v, want unrecoverable %s", l, want)
		}
	}
	if l := byOffset[4]; l == nil || l.UserID != "" || l.Original != nil {
		t.Fatalf("no-key undecodable record: %+v", l)
	}
	if l := byOffset[5]; l == nil || l.UserID != "k3" || l.Original != nil || !strings.Contains(l.Details, "malformed") {
		t.Fatalf("keyed undecodable record: %+v", l)
	}
	if l := byOffset[7]; l == nil || l.UserID != "k2" || l.Original == nil || l.Original.ExternalUserID != "other" ||
		!strings.Contains(l.Details, `routed by record key "k2"; payload external_userid "other"`) {
		t.Fatalf("key/payload mismatch dead letter: %+v", l)
	}
}

// A stop during a rebalance: the coordinator refuses the final commit
// because the group moved to a new generation without this member. That
// is a clean stop (the next owner re-reads and finds the effects done);
// any other commit failure still fails Close. Found by the scale-storm
// chaos scenario (a SIGTERM'd consumer exited with status 1).
func TestGroupMovedOnClassifiesCommitErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("commit offsets: something"), false},
		{fmt.Errorf("commit offsets: %w", kafka.NewError(kafka.ErrIllegalGeneration, "generation id is not valid", false)), true},
		{fmt.Errorf("commit offsets: partition 3: %w", kafka.NewError(kafka.ErrRebalanceInProgress, "rebalance in progress", false)), true},
		{fmt.Errorf("commit offsets: %w", kafka.NewError(kafka.ErrUnknownMemberID, "unknown member", false)), true},
		{fmt.Errorf("commit offsets: %w", kafka.NewError(kafka.ErrTransport, "broker down", false)), false},
		{fmt.Errorf("commit offsets: %w", kafka.NewError(kafka.ErrTimedOut, "timed out", false)), false},
	} {
		if got := groupMovedOn(tc.err); got != tc.want {
			t.Errorf("groupMovedOn(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
