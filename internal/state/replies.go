package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A message's replies are kept beside its done marks, under the
// partition's hash tag and the same ownership: one hash per send-time
// slot, <tag>:r:<slot>, whose field is the 63-bit digest of the reply's
// key (open_kfid:msgid:n) in decimal and whose value is what the reply
// path keeps of the reply (its fingerprint, a transfer's msg_code). The
// partition's owner is the only one that runs the message's handler, so
// no claim is taken before a reply: it is looked up (Replied), sent, and
// recorded (RecordReply). A reply sent by an owner that died before
// recording it is sent again by the next run, as an effect whose mark was
// lost is; WeChat's msgid (kf.MsgID, the same for the same reply) lets
// WeChat drop that repeat.

// replyKey is the hash of the partition's replies to messages of the
// send-time slot of sendTime.
func (s *Store) replyKey(tag string, sendTime int64) string {
	slot := sendTime / s.slotSec
	if sendTime < 0 {
		slot = 0
	}
	return tag + ":r:" + strconv.FormatInt(slot, 10)
}

// Replied returns what was recorded for the reply it (it.Key the reply's
// key, it.SendTime the message's send_time); found is false when the
// reply was not recorded.
func (l *Lease) Replied(ctx context.Context, it Item) (record string, found bool, err error) {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	v, err := l.s.cfg.Client.HGet(ctx, k, strconv.FormatInt(Digest(it.Key), 10)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("state: look up reply %s: %w", it.Key, err)
	}
	return v, true, nil
}

// RecordReply records the reply it as sent, with record. A reply sent is
// a fact: it is recorded whoever owns the partition now. The hash lives
// as long as the done marks (TTL after its last write).
func (l *Lease) RecordReply(ctx context.Context, it Item, record string) error {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	pipe := l.s.cfg.Client.Pipeline()
	pipe.HSet(ctx, k, strconv.FormatInt(Digest(it.Key), 10), record)
	pipe.PExpire(ctx, k, l.s.cfg.TTL+l.s.cfg.TTL/64)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("state: record reply %s: %w", it.Key, err)
	}
	return nil
}

// RepliedAnywhere reports which replies are recorded in any partition of
// the store under keyPrefix (default Slot), for readers that know a
// message but not its partition (the customer's timeline).
func RepliedAnywhere(ctx context.Context, client redis.UniversalClient, keyPrefix string, items []Item) ([]bool, error) {
	out := make([]bool, len(items))
	tags, err := partitionTags(ctx, client, keyPrefix)
	if err != nil || len(tags) == 0 || len(items) == 0 {
		return out, err
	}
	s := &Store{slotSec: int64(DefaultSlot / time.Second)}
	return anyPartition(ctx, client, tags, items, "replies", func(pipe redis.Pipeliner, _ int, tag string, it Item) *redis.BoolCmd {
		return pipe.HExists(ctx, s.replyKey(tag, it.SendTime), strconv.FormatInt(Digest(it.Key), 10))
	})
}
