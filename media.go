package kfpipe

import (
	"context"
	"errors"
	"io"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// MediaRef is the media an inbound message carries: a customer's image,
// voice note, video or file (Message.Media).
type MediaRef struct {
	// Type is the message's type: MsgImage, MsgVoice, MsgVideo or MsgFile.
	Type string
	// MediaID is WeChat's media_id, valid 3 days after the message: read
	// the media with OpenMedia, from the media store, not from WeChat.
	MediaID string
}

// Media returns the media m carries (ok false for a message without
// media). WeChat's sync_msg gives only the media_id; the file's name and
// type come with the media itself (MediaObject).
func (m *Message) Media() (MediaRef, bool) {
	if !media.IsMediaType(m.MsgType) {
		return MediaRef{}, false
	}
	b, err := m.body()
	if err != nil || b.MediaID == "" {
		return MediaRef{}, false
	}
	return MediaRef{Type: m.MsgType, MediaID: b.MediaID}, true
}

// MediaObject is a message's media read from the media store. The caller
// reads it and must Close it.
type MediaObject struct {
	io.ReadCloser
	// Size is its length in bytes.
	Size int64
	// ContentType is WeChat's ("image/jpeg", "audio/amr", …).
	ContentType string
	// FileName is the name WeChat gave the file (a customer's file keeps
	// its own name; an image is named after its media_id).
	FileName string
}

// Errors of OpenMedia; a handler tests them with errors.Is.
var (
	// ErrNoMedia: the message carries no media (Message.Media).
	ErrNoMedia = errors.New("kfpipe: the message carries no media")
	// ErrNoMediaStore: the handler does not run under a consumer with a
	// media store (media.store) and wecom.corp_id and wecom.secret.
	ErrNoMediaStore = errors.New("kfpipe: media needs a handler run by the consumer with media.store, wecom.corp_id and wecom.secret configured")
	// ErrMediaExpired: WeChat no longer has the media (its 3 days are
	// over) and no stage of kfpipe kept it in time — with kf-producer
	// running, a backlog older than 3 days at WeChat.
	ErrMediaExpired = media.ErrExpired
	// ErrMediaRefused: the media was not kept, by rule: larger than
	// media.max_bytes (the error names the size and the bound).
	ErrMediaRefused = media.ErrRefused
)

// OpenMedia returns the media of m, the message being handled, from the
// media store, where kfpipe copied it soon after kf-producer read the
// message (and, at the latest, before the handler was called): it is there
// for a DLQ retry on day 6 as on day 0, long after WeChat's media_id
// expired. The handler reads the object and closes it. An error that is
// none of ErrNoMedia, ErrNoMediaStore, ErrMediaExpired and ErrMediaRefused
// (the store unreachable) is worth returning: the message is retried.
func OpenMedia(ctx context.Context, m *Message) (*MediaObject, error) {
	k := media.KeeperFrom(ctx)
	if k == nil {
		return nil, ErrNoMediaStore
	}
	ref, ok := m.Media()
	if !ok {
		return nil, ErrNoMedia
	}
	r := k.Ref(m.OpenKfID, m.UpstreamMsgID, ref.Type, ref.MediaID)
	rc, info, err := k.Open(ctx, r)
	if errors.Is(err, media.ErrNotFound) {
		// Not kept yet: a handler called outside the consumer's wrapper.
		if _, err = k.Keep(ctx, "consumer", r); err == nil {
			rc, info, err = k.Open(ctx, r)
		}
	}
	if err != nil {
		return nil, err
	}
	return &MediaObject{ReadCloser: rc, Size: info.Size, ContentType: info.ContentType, FileName: info.FileName}, nil
}

// keepMedia wraps h so that a message's media is in the media store
// before h runs, and OpenMedia finds the store (media.Wrap); with
// media.store: off or no WeChat credentials, h is returned as it is.
func keepMedia(ctx context.Context, cfg *config.Consumer, base *daemon.Base, h handler.Handler) (handler.Handler, error) {
	k, err := media.FromConfig(ctx, cfg.Media, cfg.WeCom, wecom.NewRedisTokenCache(base.Redis, cfg.Redis.KeyPrefix),
		base.Log, base.Registry)
	if err != nil {
		return nil, err
	}
	return media.Wrap(h, k), nil
}
