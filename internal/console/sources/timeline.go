package sources

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/kf"
)

// The customer timeline's reads (console.CustomerSource): the user's records
// on the main topic, and the marks the schedule-consumers left of each
// message. Nothing here writes.

// timelineReadTimeout bounds one timeline's read of the main topic;
// after timelineReadStop it answers with what it read.
const (
	timelineReadTimeout = 15 * time.Second
	timelineReadStop    = 10 * time.Second
)

// dedupKept is how long a message's dedup mark is kept at least
// (dedup.ttl may not be set below it): a message older than this without
// a mark may have been processed, the mark having expired.
const dedupKept = 72 * time.Hour

// timelineReplies is how many replies per message the timeline looks for.
const timelineReplies = 4

// UserRecords reads the user's partition of the main topic from since on
// (the newest max records at most) with a consumer that joins no group
// and commits nothing, and keeps the records keyed by user.
func (p Pipeline) UserRecords(ctx context.Context, user string, since time.Time, max int) (console.TopicScan, error) {
	ctx, cancel := context.WithTimeout(ctx, timelineReadTimeout)
	defer cancel()
	scan := console.TopicScan{Topic: p.topic}
	topic := p.topic
	md, err := p.kafka.GetMetadata(&topic, false, 5000)
	if err != nil {
		return scan, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() != kafka.ErrNoError || len(tm.Partitions) == 0 {
		return scan, fmt.Errorf("metadata of %s: %v", topic, tm.Error)
	}
	scan.Partition = kafkaclient.KeyPartition(user, len(tm.Partitions))
	cm := kafkaclient.Consumer(p.kcfg, p.kcfg.ClientID+"-timeline")
	_ = cm.SetKey("client.id", p.kcfg.ClientID+"-timeline")
	c, err := kafka.NewConsumer(cm)
	if err != nil {
		return scan, err
	}
	defer func() { _ = c.Close() }()
	low, high, err := c.QueryWatermarkOffsets(topic, scan.Partition, 5000)
	if err != nil {
		return scan, fmt.Errorf("offsets of %s/%d: %w", topic, scan.Partition, err)
	}
	scan.Low, scan.To = low, high
	from := high
	ts, err := c.OffsetsForTimes([]kafka.TopicPartition{{Topic: &topic, Partition: scan.Partition,
		Offset: kafka.Offset(since.UnixMilli())}}, 5000)
	if err != nil {
		return scan, fmt.Errorf("offset at %s of %s/%d: %w", since.Format(time.RFC3339), topic, scan.Partition, err)
	}
	if len(ts) == 1 && ts[0].Offset >= 0 {
		from = int64(ts[0].Offset)
	} else if high > low && !lastBefore(c, topic, scan.Partition, low, high, since) {
		// "No record since": a broker that answers so wrongly (the demo's
		// embedded cluster always does) is caught by the newest record's
		// own time; the read then starts at the oldest kept.
		from = low
	}
	from = min(max64(from, low), high)
	scan.Expired = from == low && low > 0
	if high-from > int64(max) {
		from, scan.Truncated = high-int64(max), true
	}
	scan.From = from
	if from >= high {
		return scan, nil
	}
	if err := c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: scan.Partition, Offset: kafka.Offset(from)}}); err != nil {
		return scan, err
	}
	// The read stops short of the end after timelineReadStop: a
	// transaction left open (the DLQ scheduler re-injects in transactions)
	// holds read_committed readers back until it ends.
	stop := time.Now().Add(timelineReadStop)
	next := from
	for {
		if err := ctx.Err(); err != nil {
			return scan, fmt.Errorf("reading %s/%d offsets %d-%d: %w", topic, scan.Partition, from, high, err)
		}
		if time.Now().After(stop) {
			scan.Incomplete = fmt.Sprintf("the read stopped at offset %d of %d after %s (a transaction still open, or a slow broker): newer records were not read",
				next, high, timelineReadStop)
			scan.To = next
			return scan, nil
		}
		m, err := c.ReadMessage(200 * time.Millisecond)
		var kerr kafka.Error
		switch {
		case err == nil:
			next = int64(m.TopicPartition.Offset) + 1
			if scan.FromTime.IsZero() {
				scan.FromTime = m.Timestamp.UTC()
			}
			if string(m.Key) == user {
				scan.Records = append(scan.Records, timelineRecord(m))
			}
			if int64(m.TopicPartition.Offset) >= high-1 {
				return scan, nil
			}
		case errors.As(err, &kerr) && kerr.IsTimeout():
			// Transaction markers take offsets but are never delivered:
			// the position says whether the end was reached.
			pos, err := c.Position([]kafka.TopicPartition{{Topic: &topic, Partition: scan.Partition}})
			if err == nil && len(pos) == 1 && int64(pos[0].Offset) >= high {
				return scan, nil
			}
		default:
			return scan, fmt.Errorf("reading %s/%d: %w", topic, scan.Partition, err)
		}
	}
}

// lastBefore reports whether the partition's newest records (up to ten
// back from high) were written before since: true confirms a broker's "no
// record since". Unknown (nothing read within a second) is false.
func lastBefore(c *kafka.Consumer, topic string, partition int32, low, high int64, since time.Time) bool {
	start := max64(low, high-10)
	if err := c.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: partition, Offset: kafka.Offset(start)}}); err != nil {
		return false
	}
	defer func() { _ = c.Unassign() }()
	var last *kafka.Message
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		m, err := c.ReadMessage(100 * time.Millisecond)
		if err != nil {
			if last != nil {
				break
			}
			continue
		}
		last = m
		if int64(m.TopicPartition.Offset) >= high-1 {
			break
		}
	}
	return last != nil && last.Timestamp.Before(since)
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// timelineRecord decodes one of the user's main-topic records.
func timelineRecord(m *kafka.Message) console.TopicRecord {
	return console.TopicRecord{MainRecord: mainRecord(m)}
}

// Effects reads, for each message, its done mark and its replies (in the
// state store, and the old stores' keys while they live): nothing claimed.
func (p Pipeline) Effects(ctx context.Context, user string, msgs []console.MessageRef) ([]console.MessageEffects, error) {
	keys := make([]string, len(msgs))
	qs := make([]state.Item, len(msgs))
	var replyKeys []string
	var replyItems []state.Item
	for i, m := range msgs {
		if m.OpenKfID != "" && m.UpstreamMsgID != "" {
			keys[i] = (&chatmsg.ChatMessage{OpenKfID: m.OpenKfID, UpstreamMsgID: m.UpstreamMsgID}).DedupKey()
		}
		qs[i] = state.Item{Key: keys[i], SendTime: m.SendTime, User: user}
		for n := range timelineReplies {
			k := m.OpenKfID + ":" + m.UpstreamMsgID + ":" + strconv.Itoa(n)
			replyKeys = append(replyKeys, k)
			replyItems = append(replyItems, state.Item{Key: k, SendTime: m.SendTime})
		}
	}
	done, err := DLQStore{rdb: p.rdb, prefix: p.prefix}.DoneKeys(ctx, qs)
	if err != nil {
		return nil, err
	}
	// The replies are kept beside the marks; the old claims' reply marks
	// are read too, for as long as they live.
	sent, err := state.RepliedAnywhere(ctx, p.rdb, p.prefix, replyItems)
	if err != nil {
		return nil, err
	}
	sentBefore, err := state.LegacyDone(ctx, p.rdb, p.prefix+"reply:", replyKeys)
	if err != nil {
		return nil, err
	}
	for i := range sent {
		sent[i] = sent[i] || sentBefore[i]
	}
	okfs, ups := make([]string, len(msgs)), make([]string, len(msgs))
	for i, m := range msgs {
		okfs[i], ups[i] = m.OpenKfID, m.UpstreamMsgID
	}
	skipped, err := reply.Skips(ctx, p.rdb, p.prefix, okfs, ups)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]console.MessageEffects, len(msgs))
	for i, m := range msgs {
		fx := console.MessageEffects{Done: console.DoneNo, Replies: []console.ReplyMark{}, ReplySkipped: skipped[i]}
		old := m.SendTime == 0 || now.Sub(time.Unix(m.SendTime, 0)) > dedupKept
		switch {
		case keys[i] == "":
			fx.Done = console.DoneUnknown
		case done[i]:
			fx.Done = console.DoneYes
		case old:
			fx.Done = console.DoneUnknown
		}
		for n := range timelineReplies {
			if sent[i*timelineReplies+n] {
				fx.Replies = append(fx.Replies, console.ReplyMark{Key: replyKeys[i*timelineReplies+n],
					MsgID: kf.MsgID(m.OpenKfID, m.UpstreamMsgID, n)})
			}
		}
		fx.RepliesUnknown = len(fx.Replies) == 0 && (m.SendTime == 0 || now.Sub(time.Unix(m.SendTime, 0)) > reply.TTL)
		out[i] = fx
	}
	// What the marks no longer know (or never knew), the archive may.
	p.archivedEffects(ctx, msgs, out)
	return out, nil
}

// The timeline's reads of the conversation archive (console.ArchiveSource);
// the dlq-consumer archives beside its DLQ consumer (internal/service).

// ArchiveRetention is how far back the archive answers (0: no archive).
func (p Pipeline) ArchiveRetention() time.Duration {
	if p.archive == nil {
		return 0
	}
	return p.archive.Retention()
}

// ArchivedRecords reads the user's messages sent in [since, until) from
// the archive, and how far the archiver has come on the user's partition
// of the main topic.
func (p Pipeline) ArchivedRecords(ctx context.Context, user string, since, until time.Time, limit int) (console.ArchiveRead, error) {
	read := console.ArchiveRead{Retention: p.archive.Retention(), From: since, To: until}
	rows, more, err := p.archive.Conversation(ctx, user, since, until, limit)
	if err != nil {
		return read, err
	}
	read.Truncated = more
	for _, r := range rows {
		if r.Kind != archive.KindMessage {
			continue // the DLQ index has the letters, with their state
		}
		read.Records = append(read.Records, archiveRecord(r))
	}
	if more && len(rows) > 0 {
		// The newest max were read: the range read starts at the oldest.
		read.From = rows[0].At
	}
	// The lag on the user's partition: its high watermark against the
	// archiver's progress.
	topic := p.topic
	md, err := p.kafka.GetMetadata(&topic, false, 5000)
	if err != nil {
		return read, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || len(tm.Partitions) == 0 {
		return read, fmt.Errorf("metadata of %s: no partitions", topic)
	}
	read.Partition = kafkaclient.KeyPartition(user, len(tm.Partitions))
	progress, err := p.archive.Progress(ctx, topic)
	if err != nil {
		return read, err
	}
	for _, pr := range progress {
		if pr.Partition == read.Partition {
			read.ArchivedOffset, read.ArchivedUpTo = pr.NextOffset, pr.RecordTime.UTC()
		}
	}
	if p.group != nil {
		if _, high, err := p.group.QueryWatermarkOffsets(topic, read.Partition, 5000); err == nil {
			read.BehindBy = max(0, high-read.ArchivedOffset)
		}
	}
	return read, nil
}

// archiveRecord is an archived message as the timeline's record of it.
func archiveRecord(r archive.Row) console.TopicRecord {
	rec := console.TopicRecord{MainRecord: console.MainRecord{Partition: r.Partition, Offset: r.Offset, Time: r.Recorded,
		UpstreamMsgID: r.MsgID, OpenKfID: r.OpenKfID, MsgType: r.MsgType, SendTime: r.At.Unix()}, Archived: true}
	rec.Preview = dlq.Preview(&chatmsg.DeadLetter{Original: &chatmsg.ChatMessage{MsgType: r.MsgType, Content: r.Content}})
	return rec
}

// archivedEffects completes fx, each message's effects as the marks hold
// them, with what the archive recorded: a message handled or recovered
// is done, a reply the customer got is a reply, and one skipped because a
// human servicer held the session says so. The marks last dedup.ttl and
// the reply log reply.TTL; the archive keeps them archive.retention. A
// failed read leaves fx as the marks say.
func (p Pipeline) archivedEffects(ctx context.Context, msgs []console.MessageRef, fx []console.MessageEffects) {
	if p.archive == nil || len(msgs) == 0 {
		return
	}
	ids := make([]string, 0, len(msgs))
	at := map[string][]int{}
	for i, m := range msgs {
		if m.UpstreamMsgID == "" {
			continue
		}
		if at[m.UpstreamMsgID] == nil {
			ids = append(ids, m.UpstreamMsgID)
		}
		at[m.UpstreamMsgID] = append(at[m.UpstreamMsgID], i)
	}
	rows, err := p.archive.Outcomes(ctx, ids)
	if err != nil {
		// The archive's own read (ArchivedRecords) fails and is reported
		// the same way; the marks' answer stands.
		return
	}
	for _, r := range rows {
		for _, i := range at[r.MsgID] {
			m, e := msgs[i], &fx[i]
			if m.OpenKfID != "" && r.OpenKfID != m.OpenKfID {
				continue
			}
			switch r.Kind {
			case archive.KindHandled, archive.KindRecovered:
				e.Done = console.DoneYes
			case archive.KindReply:
				switch r.Reason {
				case archive.ReplySent:
					key := m.OpenKfID + ":" + m.UpstreamMsgID + ":" + strconv.Itoa(r.Seq)
					if !slices.ContainsFunc(e.Replies, func(x console.ReplyMark) bool { return x.Key == key }) {
						e.Replies = append(e.Replies, console.ReplyMark{Key: key, MsgID: kf.MsgID(m.OpenKfID, m.UpstreamMsgID, r.Seq)})
					}
					e.RepliesUnknown = false
				case archive.ReplyServicerSession:
					if e.ReplySkipped == "" {
						e.ReplySkipped = archive.ReplyServicerSession
					}
					e.RepliesUnknown = false
				}
			}
		}
	}
}
