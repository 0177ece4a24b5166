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

// MediaRangeBytes is the size of the ranges GetMedia downloads a media
// file in: WeChat serves media/get in HTTP ranges (Range, 206 Partial
// Content), and a file over 20 MB only so.
const MediaRangeBytes = 20 << 20

// mediaResumes bounds how many times in a row GetMedia's body asks again
// for the rest of a range whose transfer broke off.
const mediaResumes = 3

// GetMedia downloads the temporary media mediaID: a customer's image,
// voice, video or file (the media_id of an inbound message), or one
// uploaded with UploadMedia. The body is streamed, not buffered, in ranges
// of MediaRangeBytes (Config.MediaRange): a file over 20 MB comes in
// several requests, and a transfer that breaks off is resumed from the
// byte where it stopped (up to 3 times in a row) instead of starting over.
// WeChat keeps media 3 days: an expired or unknown media_id is an *Error
// with CodeInvalidMediaID (IsMediaExpired). Inbound media a kfpipe handler
// needs is better read with kfpipe.OpenMedia, from the media store that
// kept it before it expired.
func (c *Client) GetMedia(ctx context.Context, mediaID string) (*Media, error) {
	if mediaID == "" {
		return nil, errors.New("kf media/get: empty media_id")
	}
	d, err := c.getRange(ctx, mediaID, 0)
	if err != nil {
		return nil, err
	}
	if !d.Partial {
		// The whole file at once (a server that ignores ranges).
		return &Media{Body: d.Body, Size: d.Size, ContentType: d.ContentType, FileName: d.FileName}, nil
	}
	if d.Offset != 0 {
		d.Body.Close()
		return nil, fmt.Errorf("kf media/get: asked for the range at 0, got one at %d", d.Offset)
	}
	rr := &rangeReader{c: c, ctx: ctx, mediaID: mediaID, cur: d, end: d.Size, total: d.Total}
	return &Media{Body: rr, Size: d.Total, ContentType: d.ContentType, FileName: d.FileName}, nil
}

// getRange asks media/get for the range at offset, retrying WeChat's
// retryable errcodes.
func (c *Client) getRange(ctx context.Context, mediaID string, offset int64) (*wecom.Download, error) {
	wait := retryWait
	for try := 1; ; try++ {
		d, err := c.c.DownloadRange(ctx, "media/get", "/cgi-bin/media/get", url.Values{"media_id": {mediaID}}, offset, c.mediaRange)
		if err == nil {
			return d, nil
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

// rangeReader reads a media file range by range: at the end of one it
// asks for the next, and a range whose transfer broke off is asked again
// from the first byte not read.
type rangeReader struct {
	c       *Client
	ctx     context.Context
	mediaID string
	cur     *wecom.Download // the open range; nil between ranges
	off     int64           // bytes of the file read so far
	end     int64           // the open range's end (exclusive)
	total   int64           // the file's size (-1 unknown)
	resumes int             // resumes in a row without progress
	err     error
}

func (r *rangeReader) Read(p []byte) (int, error) {
	for r.err == nil {
		if r.cur == nil {
			if r.total >= 0 && r.off >= r.total {
				return 0, io.EOF
			}
			d, err := r.c.getRange(r.ctx, r.mediaID, r.off)
			if err != nil {
				r.err = fmt.Errorf("kf media/get: the range at byte %d: %w", r.off, err)
				break
			}
			if !d.Partial || d.Offset != r.off {
				d.Body.Close()
				r.err = fmt.Errorf("kf media/get: asked for the range at byte %d, got %s", r.off, describeRange(d))
				break
			}
			r.cur, r.end = d, r.off+d.Size
			if r.total < 0 {
				r.total = d.Total
			}
		}
		n, err := r.cur.Body.Read(p)
		r.off += int64(n)
		if n > 0 {
			r.resumes = 0
		}
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == io.EOF && (r.cur.Size < 0 || r.off >= r.end):
			// The range is complete; the next one, if any, on the next Read.
			r.cur.Body.Close()
			r.cur = nil
			if n > 0 {
				return n, nil
			}
		case err != nil:
			// Broke off before the range's end: ask again from r.off.
			r.cur.Body.Close()
			r.cur = nil
			if r.resumes++; r.resumes > mediaResumes || r.ctx.Err() != nil {
				r.err = fmt.Errorf("kf media/get: the transfer broke off at byte %d %d times in a row: %w", r.off, r.resumes, err)
			}
			if n > 0 {
				return n, nil
			}
		}
	}
	return 0, r.err
}

func (r *rangeReader) Close() error {
	if r.cur != nil {
		err := r.cur.Body.Close()
		r.cur = nil
		return err
	}
	return nil
}

func describeRange(d *wecom.Download) string {
	if !d.Partial {
		return "the whole file (200)"
	}
	return fmt.Sprintf("the range at byte %d", d.Offset)
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
