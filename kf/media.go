package kf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Media is a media file downloaded from WeChat (media/get). The caller
// reads Body and must Close it.
type Media struct {
	Body io.ReadCloser
	// Size is the length WeChat announced, -1 when it sent none.
	Size int64
	// ContentType is WeChat's Content-Type ("image/jpeg", "audio/amr" …).
	ContentType string
	// FileName is the filename of WeChat's Content-Disposition ("" none):
	// a customer's file keeps its name there.
	FileName string
}

// GetMedia downloads the temporary media mediaID: a customer's image,
// voice, video or file (the media_id of an inbound message), or one
// uploaded with UploadMedia. The body is streamed, not buffered. WeChat
// keeps media 3 days: an expired or unknown media_id is an *Error with
// CodeInvalidMediaID (IsMediaExpired). Inbound media a kfpipe handler
// needs is better read with kfpipe.OpenMedia, from the media store that
// kept it before it expired.
func (c *Client) GetMedia(ctx context.Context, mediaID string) (*Media, error) {
	if mediaID == "" {
		return nil, errors.New("kf media/get: empty media_id")
	}
	wait := retryWait
	for try := 1; ; try++ {
		d, err := c.c.Download(ctx, "media/get", "/cgi-bin/media/get", url.Values{"media_id": {mediaID}})
		if err == nil {
			return &Media{Body: d.Body, Size: d.Size, ContentType: d.ContentType, FileName: d.FileName}, nil
		}
		var ae *wecom.APIError
		if !errors.As(err, &ae) {
			return nil, fmt.Errorf("kf media/get: %w", err)
		}
		e := &Error{API: "media/get", Code: ae.Code, Msg: ae.Msg}
		if !e.Retryable() || try >= 4 || !sleepCtx(ctx, wait) {
			return nil, e
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// IsMediaExpired reports whether err is WeChat's answer for a media_id it
// no longer has (40007: older than 3 days, or never uploaded).
func IsMediaExpired(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeInvalidMediaID
}

// The backoff of GetMedia between retryable errcodes, as call's.
const (
	retryWait    = 200 * time.Millisecond
	maxRetryWait = 5 * time.Second
)

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
