package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/google/uuid"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// Coord is where a dead letter sits in the DLQ topic. The Redis index
// keeps only a letter's summary and its Coord; the whole letter (payload,
// headers, details) is read back from the topic when it is needed: to
// re-inject it, to show it to an operator, to export it.
type Coord struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

func (c Coord) String() string { return fmt.Sprintf("%d:%d", c.Partition, c.Offset) }

// parseCoord reads Coord.String's form.
func parseCoord(s string) (Coord, bool) {
	p, o, ok := strings.Cut(s, ":")
	pn, err1 := strconv.ParseInt(p, 10, 32)
	on, err2 := strconv.ParseInt(o, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return Coord{}, false
	}
	return Coord{Partition: int32(pn), Offset: on}, true
}

// Letters reads whole dead letters back by their DLQ coordinates;
// *TopicLetters reads them from the DLQ topic.
type Letters interface {
	// Read returns the letters at the coordinates, in their order; a
	// letter the topic no longer holds (retention) is nil.
	Read(ctx context.Context, at []Coord) ([]*chatmsg.DeadLetter, error)
}

// WithLetters lets the index read whole letters back (Get, Export, the
// scheduler's re-injection). Without it the index serves summaries only.
func WithLetters(l Letters) Option { return func(o *options) { o.letters = l } }

// TopicLetters reads dead letters from the DLQ topic by partition and
// offset, with a consumer of its own that joins no group and commits
// nothing. Reads are serialised; a batch is read partition by partition
// in offset order, so letters written together come back in one fetch.
type TopicLetters struct {
	topic   string
	timeout time.Duration
	mu      sync.Mutex
	kc      *kafka.Consumer
}

// NewTopicLetters returns a reader of cfg's DLQ topic; Close releases it.
func NewTopicLetters(cfg config.Kafka) (*TopicLetters, error) {
	cm := kafkaclient.Consumer(cfg, cfg.Consumer.GroupID+"-reader-"+uuid.NewString())
	// An offset retention already deleted resets to the earliest record:
	// the reader then sees a later offset and reports the letter gone.
	_ = cm.SetKey("auto.offset.reset", "earliest")
	kc, err := kafka.NewConsumer(cm)
	if err != nil {
		return nil, fmt.Errorf("dlq letters: %w", err)
	}
	return &TopicLetters{topic: cfg.Topics.DLQ.Name, timeout: 10 * time.Second, kc: kc}, nil
}

// Close closes the reader's consumer.
func (r *TopicLetters) Close() error { return r.kc.Close() }

// seekGap is how far ahead the next wanted offset may be before the
// reader seeks instead of reading through.
const seekGap = 200

// Read implements Letters.
func (r *TopicLetters) Read(ctx context.Context, at []Coord) ([]*chatmsg.DeadLetter, error) {
	out := make([]*chatmsg.DeadLetter, len(at))
	order := make([]int, len(at))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(at[a].Partition, at[b].Partition), cmp.Compare(at[a].Offset, at[b].Offset))
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { _ = r.kc.Unassign() }()
	for start := 0; start < len(order); {
		end := start
		for end < len(order) && at[order[end]].Partition == at[order[start]].Partition {
			end++
		}
		if err := r.readPartition(ctx, at, order[start:end], out); err != nil {
			return nil, err
		}
		start = end
	}
	return out, nil
}

// readPartition reads the wanted offsets of one partition (ascending).
func (r *TopicLetters) readPartition(ctx context.Context, at []Coord, want []int, out []*chatmsg.DeadLetter) error {
	part := at[want[0]].Partition
	assign := func(off int64) error {
		return r.kc.Assign([]kafka.TopicPartition{{Topic: &r.topic, Partition: part, Offset: kafka.Offset(off)}})
	}
	if err := assign(at[want[0]].Offset); err != nil {
		return fmt.Errorf("dlq letters: assign %s/%d: %w", r.topic, part, err)
	}
	deadline := time.Now().Add(r.timeout)
	for i := 0; i < len(want); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dlq letters: %s/%d offset %d not read within %s", r.topic, part, at[want[i]].Offset, r.timeout)
		}
		ev := r.kc.Poll(100)
		m, ok := ev.(*kafka.Message)
		if !ok {
			if e, isErr := ev.(kafka.Error); isErr && e.IsFatal() {
				return fmt.Errorf("dlq letters: %w", e)
			}
			continue
		}
		if m.TopicPartition.Partition != part {
			continue
		}
		off := int64(m.TopicPartition.Offset)
		for i < len(want) && at[want[i]].Offset < off {
			i++ // gone: retention deleted it (out stays nil)
		}
		if i < len(want) && at[want[i]].Offset == off {
			out[want[i]], _ = letterFromRecord(m)
			i++
			deadline = time.Now().Add(r.timeout)
		}
		if i < len(want) && at[want[i]].Offset > off+seekGap {
			if err := assign(at[want[i]].Offset); err != nil {
				return fmt.Errorf("dlq letters: assign %s/%d: %w", r.topic, part, err)
			}
		}
	}
	return nil
}

// letterFromRecord decodes a DLQ record; one that does not decode becomes
// a review entry keeping the raw bytes (its ID from its own DLQ
// coordinates), so it is never lost and an operator can see it, and the
// decoding error is returned with it.
func letterFromRecord(m *kafka.Message) (*chatmsg.DeadLetter, error) {
	dl, err := Decode(m.Value)
	if err == nil && dl.Event == "" && dl.Reason == "" {
		err = errors.New("no failure_reason")
	}
	if err == nil {
		return dl, nil
	}
	hs := make([]chatmsg.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = chatmsg.Header{Key: h.Key, Value: h.Value}
	}
	topic := ""
	if m.TopicPartition.Topic != nil {
		topic = *m.TopicPartition.Topic
	}
	ts := m.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	dl = chatmsg.NewDeadLetter(chatmsg.Source{Topic: topic, Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
		Timestamp: m.Timestamp, Key: m.Key, Value: m.Value, Headers: hs}, ReasonInvalidMessage,
		"undecodable DLQ record: "+err.Error(), ts)
	dl.Original = nil
	dl.ManualReview, dl.Recoverable = true, false
	return dl, err
}

// previewBytes bounds a letter's preview in the index: short enough that
// the entry's Redis hash keeps its compact encoding (values ≤ 64 bytes).
const previewBytes = 30

// Preview is the start of the letter's text for the index and the
// console's lists: a text message's content, else its WeChat msgtype, or
// the start of a payload that did not parse.
func Preview(dl *chatmsg.DeadLetter) string {
	var s string
	switch {
	case dl.Original != nil:
		s = dl.Original.MsgType
		var item struct {
			Text struct {
				Content string `json:"content"`
			} `json:"text"`
		}
		if json.Unmarshal(dl.Original.Content, &item) == nil && item.Text.Content != "" {
			s = item.Text.Content
		}
	default:
		s = strings.ToValidUTF8(string(dl.OriginalValue[:min(len(dl.OriginalValue), previewBytes)]), "")
	}
	if len(s) <= previewBytes {
		return s
	}
	cut := previewBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
