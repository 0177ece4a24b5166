package reply

import (
	"context"
	"fmt"

	"github.com/kfpipe/kfpipe/internal/handler"
)

// A message's memos are values a handler computes once per message (an
// upload's media_id, a model's answer) and uses in its replies: kept in
// the message's reply log, under the same ownership and for as long as its
// replies, so a handler that runs again for the message gets the value the
// first run recorded and replies the same way. A memo's key is the
// message's and its name, with a "memo:" part no reply's key (its number)
// has.

// memoKey is the reply-log key of the memo name of the message to.
func memoKey(to Target, name string) string {
	return to.OpenKfID + ":" + to.UpstreamMsgID + ":memo:" + name
}

// Memo returns the value recorded for name with the message the handler
// call ctx belongs to; when there is none it calls compute, records what
// it returns and returns that. An error of compute is returned as it is
// and nothing is recorded (the next run computes again). ok false: ctx is
// not a handler call's.
//
// Two runs of one message at once (an owner that lost its partition while
// paused and the next) may both compute; each returns what it recorded.
func Memo(ctx context.Context, name string, compute func(context.Context) (string, error)) (value string, err error) {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil {
		return "", ErrNoReplier
	}
	log, ok := handler.ReplyLogOf(ctx)
	if !ok {
		if s.fx == nil {
			return "", ErrNoReplier
		}
		log = s.fx.own
	}
	it := handler.StateItem{Key: memoKey(s.to, name), SendTime: s.to.SendTime, User: s.to.User}
	v, found, err := log.Replied(ctx, it)
	if err != nil {
		return "", fmt.Errorf("memo %s: %w", name, err)
	}
	if found {
		return v, nil
	}
	if v, err = compute(ctx); err != nil {
		return "", err
	}
	if err := log.RecordReply(ctx, it, v); err != nil {
		// Not recorded: the message is retried and computes again.
		return "", fmt.Errorf("memo %s: record: %w", name, err)
	}
	return v, nil
}
