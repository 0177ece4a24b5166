package sources

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// The console's Kafka card (console.KafkaSource): metadata and group offsets
// of the two topics, and a read-only page of the main topic. The reader
// joins no group and commits nothing.

// browseScan caps how many records one page reads per partition: a user's
// records are among everyone's on their partition, so a page may cover
// fewer than its limit and says where to go on (next_before).
const browseScan = 5000

// KafkaContext reads the brokers, each topic's partitions with their
// replicas and in-sync replicas, and the reading group's lag.
func (p Pipeline) KafkaContext(ctx context.Context) (console.KafkaContext, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var kc console.KafkaContext
	var errs []error
	for _, t := range []struct {
		role, name, group string
		reader            *kafka.Consumer
	}{{"main", p.topic, p.groupName, p.group}, {"dlq", p.dlqTopic, p.dlqGroupName, p.dlqGroup}} {
		if t.name == "" {
			continue
		}
		kt := console.KafkaTopic{Role: t.role, Name: t.name, Group: t.group, Partitions: []console.KafkaPartition{}}
		name := t.name
		md, err := p.kafka.GetMetadata(&name, false, 5000)
		if err != nil {
			kt.Error = fmt.Sprintf("metadata: %v", err)
			errs = append(errs, fmt.Errorf("%s: %s", name, kt.Error))
			kc.Topics = append(kc.Topics, kt)
			continue
		}
		if kc.Brokers == nil {
			for _, b := range md.Brokers {
				kc.Brokers = append(kc.Brokers, console.KafkaBroker{ID: b.ID, Host: b.Host, Port: b.Port})
			}
			slices.SortFunc(kc.Brokers, func(a, b console.KafkaBroker) int { return int(a.ID - b.ID) })
		}
		tm := md.Topics[name]
		byPart := map[int32]int{}
		for _, pm := range tm.Partitions {
			byPart[pm.ID] = len(kt.Partitions)
			kt.Partitions = append(kt.Partitions, console.KafkaPartition{Partition: pm.ID, Leader: pm.Leader,
				Replicas: orEmpty(pm.Replicas), ISR: orEmpty(pm.Isrs), Committed: -1})
		}
		slices.SortFunc(kt.Partitions, func(a, b console.KafkaPartition) int { return int(a.Partition - b.Partition) })
		for i, kp := range kt.Partitions {
			byPart[kp.Partition] = i
		}
		if t.reader != nil {
			lag, err := kafkaclient.GroupLag(ctx, p.kafka, t.reader, name)
			if err != nil {
				kt.Error = fmt.Sprintf("offsets of group %s: %v", t.group, err)
				errs = append(errs, fmt.Errorf("%s: %s", name, kt.Error))
			}
			for _, l := range lag {
				if i, ok := byPart[l.Partition]; ok {
					kp := &kt.Partitions[i]
					kp.End, kp.Committed, kp.Lag = l.End, l.Committed, l.Lag
					kt.LagTotal += l.Lag
				}
			}
		}
		kc.Topics = append(kc.Topics, kt)
	}
	if kc.Brokers == nil {
		kc.Brokers = []console.KafkaBroker{}
	}
	return kc, errors.Join(errs...)
}

func orEmpty(v []int32) []int32 {
	if v == nil {
		return []int32{}
	}
	return slices.Sorted(slices.Values(v))
}

// TopicRecords reads one page of the main topic: the user's partition (or
// every partition for a msgid alone) between q.Since and q.Before, at most
// browseScan records a partition, keeping the records of q.User and q.MsgID.
func (p Pipeline) TopicRecords(ctx context.Context, q console.RecordQuery) (console.RecordPage, error) {
	ctx, cancel := context.WithTimeout(ctx, timelineReadTimeout)
	defer cancel()
	topic := p.topic
	page := console.RecordPage{Topic: topic, Partition: -1}
	md, err := p.kafka.GetMetadata(&topic, false, 5000)
	if err != nil {
		return page, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() != kafka.ErrNoError || len(tm.Partitions) == 0 {
		return page, fmt.Errorf("metadata of %s: %v", topic, tm.Error)
	}
	var parts []int32
	if q.User != "" {
		page.Partition = kafkaclient.KeyPartition(q.User, len(tm.Partitions))
		parts = []int32{page.Partition}
	} else {
		for _, pm := range tm.Partitions {
			parts = append(parts, pm.ID)
		}
		slices.Sort(parts)
	}
	cm := kafkaclient.Consumer(p.kcfg, p.kcfg.ClientID+"-browse")
	_ = cm.SetKey("client.id", p.kcfg.ClientID+"-browse")
	c, err := kafka.NewConsumer(cm)
	if err != nil {
		return page, err
	}
	defer func() { _ = c.Close() }()
	match := func(m *kafka.Message, r *console.BrowsedRecord) bool {
		return (q.User == "" || string(m.Key) == q.User) && (q.MsgID == "" || r.UpstreamMsgID == q.MsgID)
	}
	for _, part := range parts {
		low, high, err := c.QueryWatermarkOffsets(topic, part, 5000)
		if err != nil {
			return page, fmt.Errorf("offsets of %s/%d: %w", topic, part, err)
		}
		floor := low
		ts, err := c.OffsetsForTimes([]kafka.TopicPartition{{Topic: &topic, Partition: part,
			Offset: kafka.Offset(q.Since.UnixMilli())}}, 5000)
		if err != nil {
			return page, fmt.Errorf("offset at %s of %s/%d: %w", q.Since.Format(time.RFC3339), topic, part, err)
		}
		if len(ts) == 1 {
			if ts[0].Offset >= 0 {
				floor = max(floor, int64(ts[0].Offset))
			} else {
				floor = high // nothing since
			}
		}
		to := high
		if q.Before >= 0 {
			to = min(to, q.Before)
		}
		from := min(max(floor, to-browseScan), to)
		if page.Partition >= 0 {
			page.From, page.To = from, to
		}
		got, note, err := readRange(ctx, c, topic, part, from, to, match)
		if err != nil {
			return page, err
		}
		if note != "" {
			page.Note = note
		}
		slices.Reverse(got)
		page.Records = append(page.Records, got...)
		if page.Partition >= 0 {
			switch {
			case len(page.Records) > q.Limit:
				page.Records = page.Records[:q.Limit]
				next := page.Records[q.Limit-1].Offset
				page.NextBefore = &next
			case from > floor:
				next := from
				page.NextBefore = &next
				page.Note = fmt.Sprintf("read the %d records before offset %d (of everyone on the partition); older ones: the next page", to-from, to)
			}
		}
	}
	if page.Partition < 0 {
		slices.SortFunc(page.Records, func(a, b console.BrowsedRecord) int { return b.Time.Compare(a.Time) })
		if len(page.Records) > q.Limit {
			page.Records = page.Records[:q.Limit]
		}
	}
	return page, nil
}

// readRange reads [from, to) of one partition (read_committed) and returns
// the records match keeps, oldest first. It stops after timelineReadStop
// and says so: an open transaction holds the reader back.
func readRange(ctx context.Context, c *kafka.Consumer, topic string, part int32, from, to int64,
	match func(*kafka.Message, *console.BrowsedRecord) bool) ([]console.BrowsedRecord, string, error) {
	if from >= to {
		return nil, "", nil
	}
	if err := c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: part, Offset: kafka.Offset(from)}}); err != nil {
		return nil, "", err
	}
	defer func() { _ = c.Unassign() }()
	var out []console.BrowsedRecord
	stop := time.Now().Add(timelineReadStop)
	next := from
	for {
		if err := ctx.Err(); err != nil {
			return out, "", fmt.Errorf("reading %s/%d offsets %d-%d: %w", topic, part, from, to, err)
		}
		if time.Now().After(stop) {
			return out, fmt.Sprintf("the read of partition %d stopped at offset %d of %d after %s (a transaction still open?)",
				part, next, to, timelineReadStop), nil
		}
		m, err := c.ReadMessage(200 * time.Millisecond)
		var kerr kafka.Error
		switch {
		case err == nil:
			off := int64(m.TopicPartition.Offset)
			next = off + 1
			if off >= to {
				return out, "", nil
			}
			r := browsedRecord(m)
			if match(m, &r) {
				out = append(out, r)
			}
			if off >= to-1 {
				return out, "", nil
			}
		case errors.As(err, &kerr) && kerr.IsTimeout():
			pos, err := c.Position([]kafka.TopicPartition{{Topic: &topic, Partition: part}})
			if err == nil && len(pos) == 1 && int64(pos[0].Offset) >= to {
				return out, "", nil
			}
		default:
			return out, "", fmt.Errorf("reading %s/%d: %w", topic, part, err)
		}
	}
}

// browsedRecord decodes one main-topic record with its key, headers and
// value.
func browsedRecord(m *kafka.Message) console.BrowsedRecord {
	r := console.BrowsedRecord{MainRecord: mainRecord(m), Key: string(m.Key), Headers: make(map[string]string, len(m.Headers))}
	for _, h := range m.Headers {
		r.Headers[h.Key] = string(h.Value)
	}
	if r.Invalid == "" {
		r.Message = append([]byte(nil), m.Value...)
	}
	return r
}

// mainRecord decodes one main-topic record into the console's one view of
// it (the topic browser's and a customer's timeline's).
func mainRecord(m *kafka.Message) console.MainRecord {
	r := console.MainRecord{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset), Time: m.Timestamp.UTC()}
	for _, h := range m.Headers {
		switch h.Key {
		case chatmsg.HeaderRetryFromDLQ:
			r.RetryFromDLQ = string(h.Value) == "true"
		case chatmsg.HeaderRetryCount:
			r.RetryCount, _ = strconv.Atoi(string(h.Value))
		}
	}
	cm, err := chatmsg.Decode(m.Value)
	if err != nil {
		r.Invalid = err.Error()
		return r
	}
	r.UpstreamMsgID, r.OpenKfID, r.MsgType, r.SendTime = cm.UpstreamMsgID, cm.OpenKfID, cm.MsgType, cm.SendTime
	r.MessageID = strconv.FormatInt(cm.MessageID, 10)
	r.Preview = dlq.Preview(&chatmsg.DeadLetter{Original: cm})
	return r
}
