package kfpipetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/media"
)

// Media a customer sends: ImageWith, FileWith and MediaWith build a
// message whose media_id the Harness's fake WeChat serves (media/get) with
// the bytes given, and Run keeps it in a media store of the test's own (a
// temporary directory) before the handler runs, as the consumer does: the
// handler reads it with kfpipe.OpenMedia. ExpireMedia ends a media_id at
// the fake WeChat, as 3 days do.

// ImageWith is an image user sent whose bytes are data (its content type
// sniffed from them: image/png, image/jpeg, …).
func (hs *Harness) ImageWith(user string, data []byte) *kfpipe.Message {
	return hs.MediaWith(user, kfpipe.MsgImage, "", http.DetectContentType(data), data)
}

// FileWith is a file named fileName user sent whose bytes are data.
func (hs *Harness) FileWith(user, fileName string, data []byte) *kfpipe.Message {
	return hs.MediaWith(user, kfpipe.MsgFile, fileName, http.DetectContentType(data), data)
}

// MediaWith is a media message of msgType (kfpipe.MsgImage, MsgVoice,
// MsgVideo or MsgFile) user sent, whose media WeChat serves as data with
// contentType and fileName ("" ⇒ "<media_id>.<ext>", as WeChat names
// them).
func (hs *Harness) MediaWith(user, msgType, fileName, contentType string, data []byte) *kfpipe.Message {
	hs.t.Helper()
	if !media.IsMediaType(msgType) {
		hs.t.Fatalf("kfpipetest: MediaWith: %q is not a media type (image, voice, video or file)", msgType)
	}
	id := hs.fake.PutMedia(fileName, contentType, data)
	return message(user, kfpipe.OriginCustomer, "", msgType, map[string]any{"media_id": id})
}

// ExpireMedia makes the fake WeChat answer 40007 (invalid media_id) for
// m's media from now on, as WeChat does 3 days after the message: media
// already kept in the store (a Run of m before) is still there for
// OpenMedia; media never kept is kfpipe.ErrMediaExpired.
func (hs *Harness) ExpireMedia(m *kfpipe.Message) {
	hs.t.Helper()
	ref, ok := m.Media()
	if !ok {
		hs.t.Fatalf("kfpipetest: ExpireMedia: message %s carries no media", m.UpstreamMsgID)
	}
	hs.fake.ExpireMedia(ref.MediaID)
}

// newKeeper returns the harness's media keeper: a temporary directory
// store, removed when the test ends, filled from the fake WeChat.
func (hs *Harness) newKeeper() (*media.Keeper, error) {
	dir, err := os.MkdirTemp("", "kfpipetest-media-")
	if err != nil {
		return nil, fmt.Errorf("media store: %w", err)
	}
	hs.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	store, err := media.NewDirStore(dir)
	if err != nil {
		return nil, err
	}
	return media.NewKeeper(store, hs.kc, media.KeeperConfig{CorpID: hs.fake.CorpID(), MaxBytes: hs.maxMedia}), nil
}

// keepMedia keeps m's media before a handler call, as the consumer's
// wrapper does: a failure other than expired media fails the attempt.
func (hs *Harness) keepMedia(ctx context.Context, m *kfpipe.Message) error {
	ref, ok := m.Media()
	if !ok {
		return nil
	}
	r := hs.keeper.Ref(m.OpenKfID, m.UpstreamMsgID, ref.Type, ref.MediaID)
	if _, err := hs.keeper.Keep(ctx, "consumer", r); err != nil && !errors.Is(err, media.ErrExpired) {
		return fmt.Errorf("keep the message's media before the handler: %w", err)
	}
	return nil
}

// MaxMediaBytes bounds a kept media object (media.max_bytes; default 0,
// no bound): a larger one is refused and kfpipe.OpenMedia returns
// kfpipe.ErrMediaRefused.
func MaxMediaBytes(n int64) Option { return func(h *Harness) { h.maxMedia = n } }
