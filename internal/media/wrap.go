package media

import (
	"context"
	"errors"
	"fmt"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
)

// Wrap returns h that keeps a message's media (stage consumer) before it
// calls h, and gives h the keeper (KeeperFrom), so the media is in the
// store when the handler runs. A media object kf-producer's stage already
// kept costs one Stat. A failure to keep it after media.retries is the
// message's failure: retried in place, then dead-lettered with the reason
// in its details and retried from the DLQ — never a handler that runs
// without media it could have had. Media WeChat no longer has (ErrExpired)
// or refused as too large is the handler's to answer: it runs, and
// kfpipe.OpenMedia says why there is no media. k nil (keeping off)
// returns h.
func Wrap(h handler.Handler, k *Keeper) handler.Handler {
	if k == nil {
		return h
	}
	return handler.HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		ctx = WithKeeper(ctx, k)
		msgs := []*chatmsg.ChatMessage{m}
		if b := handler.BatchFrom(ctx); len(b) > 0 {
			// A batch (consumer.WithBatch): every message's media.
			msgs = msgs[:0]
			for _, it := range b {
				msgs = append(msgs, it.Msg)
			}
		}
		for _, m := range msgs {
			if ref, ok := k.RefOf(m); ok {
				if _, err := k.Keep(ctx, "consumer", ref); err != nil && !errors.Is(err, ErrExpired) {
					return fmt.Errorf("keep the message's media before the handler: %w", err)
				}
			}
		}
		return h.Handle(ctx, m)
	})
}
