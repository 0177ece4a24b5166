package kfpipe

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kfpipe/kfpipe/internal/reply"
)

// Memo returns the value of the side step name for the message being
// handled: computed by compute the first time the handler asks for it,
// then kept with the message's replies — in the same store, under the
// same ownership (the partition's lease), for as long — so a handler that
// runs again for the message (a retry, a crash, a rebalance, a DLQ
// recovery) gets the value the first run kept and replies the same way.
// It is what a reply that needs a side step uses: the media_id of an
// upload (WeChat gives a new one for every upload), a model's answer, a
// ticket number.
//
//	id, err := kfpipe.Memo(ctx, "upload", func(ctx context.Context) (string, error) {
//		return kc.UploadMedia(ctx, "image", "answer.png", png)
//	})
//	…
//	return kfpipe.Reply(ctx, kf.Image{MediaID: id})
//
// The value is kept as JSON. An error of compute is returned as it is
// and nothing is kept: the next run computes again. compute may run more
// than once when the handler fails before the value is kept (the upload
// happens again; its first media_id is never used), never after. A value
// is kept per message and name: two steps of one handler need two names.
// Outside a handler run by the consumer or kfpipetest, Memo returns
// ErrNoReplier.
func Memo[T any](ctx context.Context, name string, compute func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	var computed *T
	v, err := reply.Memo(ctx, name, func(ctx context.Context) (string, error) {
		t, err := compute(ctx)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(t)
		if err != nil {
			return "", Permanent(fmt.Errorf("kfpipe: Memo %s: the value does not encode as JSON: %w", name, err))
		}
		computed = &t
		return string(b), nil
	})
	if err != nil {
		return zero, err
	}
	if computed != nil {
		return *computed, nil
	}
	var t T
	if err := json.Unmarshal([]byte(v), &t); err != nil {
		return zero, Permanent(fmt.Errorf("kfpipe: Memo %s: the kept value does not decode into %T: %w", name, t, err))
	}
	return t, nil
}
