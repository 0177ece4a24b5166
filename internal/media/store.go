// Package media keeps the media customers send (images, voice notes,
// videos, files) before WeChat forgets them: a media_id is valid 3 days,
// a message may be handled later than that (a backlog, a DLQ retry on day
// 4). The Keeper downloads each inbound media object (media/get) and puts
// it in a Store — a local directory (DirStore) or an S3-compatible bucket
// (S3Store) — under the message's identity (corp, open_kfid, msgid); the
// handler reads it from there (kfpipe.OpenMedia).
//
// kf-producer keeps media soonest, right after a page of messages is in
// Kafka (Stage); the consumer keeps what is not yet kept before the
// handler runs (Wrap), so the store holds a message's media before its
// handler is called, whatever happened to kf-producer's queue.
package media

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Errors of a Store and the Keeper.
var (
	// ErrNotFound is returned by Store.Open and Stat for a key not stored.
	ErrNotFound = errors.New("media: not in the store")
	// ErrExpired is returned by Keeper.Keep when WeChat no longer has the
	// media (errcode 40007, after 3 days) and the store never kept it.
	ErrExpired = errors.New("media: WeChat no longer has the media_id (40007) and the store never kept it")
	// ErrRefused is returned by Keeper.Open for media the keeper refused
	// (larger than media.max_bytes); the error says the reason.
	ErrRefused = errors.New("media: refused")
)

// Refusal reasons (Info.Refused, the reason label of the metrics).
const (
	RefusedTooLarge = "too_large" // larger than media.max_bytes
)

// Info describes a stored media object.
type Info struct {
	// Size is the object's length in bytes.
	Size int64 `json:"size"`
	// ContentType and FileName are what WeChat's media/get said.
	ContentType string `json:"content_type,omitempty"`
	FileName    string `json:"file_name,omitempty"`
	// MsgType and MediaID are the message's: image, voice, video or file.
	MsgType string `json:"msg_type,omitempty"`
	MediaID string `json:"media_id,omitempty"`
	// Refused, when not empty, is why the object was not kept (a
	// Reason… constant with details): only this record is stored.
	Refused string `json:"refused,omitempty"`
	// Kept is when the object was stored.
	Kept time.Time `json:"kept"`
}

// Store holds media objects by key. Implementations are safe for
// concurrent use; a Put of a key already stored replaces it whole (a
// reader never sees a partial object).
type Store interface {
	// Put stores the size bytes of r (size -1: read r to EOF) with info.
	Put(ctx context.Context, key string, r io.Reader, size int64, info Info) error
	// Open returns the object and its info; ErrNotFound when not stored.
	Open(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// Stat returns the info of the object; ErrNotFound when not stored.
	Stat(ctx context.Context, key string) (Info, error)
}

// Ref is the media an inbound message carries.
type Ref struct {
	CorpID, OpenKfID, MsgID string
	// MsgType is image, voice, video or file.
	MsgType string
	MediaID string
}

// Key is the object's key in the store: "<corp>/<open_kfid>/<msgid>". The
// upstream msgid is stable across re-pulls and DLQ retries (I3), so every
// delivery of the message finds the same object.
func (r Ref) Key() (string, error) {
	for _, p := range []struct{ name, v string }{{"corp_id", r.CorpID}, {"open_kfid", r.OpenKfID}, {"msgid", r.MsgID}} {
		if p.v == "" || p.v == "." || p.v == ".." || strings.ContainsAny(p.v, "/\\\x00") {
			return "", fmt.Errorf("media: %s %q cannot be part of a store key", p.name, p.v)
		}
	}
	return r.CorpID + "/" + r.OpenKfID + "/" + r.MsgID, nil
}

// IsMediaType reports whether WeChat's msgtype carries a media_id.
func IsMediaType(msgType string) bool {
	switch msgType {
	case "image", "voice", "video", "file":
		return true
	}
	return false
}

// RefOf returns the media of m for corp (ok false when m carries none or
// its content cannot be read).
func RefOf(corpID string, m *chatmsg.ChatMessage) (Ref, bool) {
	if !IsMediaType(m.MsgType) {
		return Ref{}, false
	}
	b, err := m.Body()
	if err != nil || b.MediaID == "" {
		return Ref{}, false
	}
	return Ref{CorpID: corpID, OpenKfID: m.OpenKfID, MsgID: m.UpstreamMsgID, MsgType: m.MsgType, MediaID: b.MediaID}, true
}

// contextKey carries the Keeper of a handler's run.
type contextKey struct{}

// WithKeeper returns ctx carrying k, for kfpipe.OpenMedia.
func WithKeeper(ctx context.Context, k *Keeper) context.Context {
	return context.WithValue(ctx, contextKey{}, k)
}

// KeeperFrom returns the Keeper ctx carries (nil none).
func KeeperFrom(ctx context.Context) *Keeper {
	k, _ := ctx.Value(contextKey{}).(*Keeper)
	return k
}
