package wecom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Download is a file WeChat streams back (media/get): the caller reads
// Body and must Close it.
type Download struct {
	Body io.ReadCloser
	// Size is the Content-Length, -1 when WeChat did not send one.
	Size        int64
	ContentType string
	// FileName is the filename of the Content-Disposition ("" none).
	FileName string
	// Partial: WeChat answered a range (206 Partial Content) of a file of
	// Total bytes (-1 unknown), starting at Offset; Size is the range's.
	Partial       bool
	Offset, Total int64
}

// maxErrorBytes bounds the JSON error body of a download.
const maxErrorBytes = 64 << 10

// Download GETs the API at path with query and the access token, for the APIs
// that answer a file on success and a JSON errcode on failure (media/get).
// A non-zero errcode is an *APIError; tokens and transient failures are
// retried as for Call. The client's request timeout bounds the wait for
// the response's headers, not the reading of Body: ctx bounds that.
func (c *Client) Download(ctx context.Context, api, path string, query url.Values) (*Download, error) {
	return c.DownloadRange(ctx, api, path, query, 0, -1)
}

// DownloadRange is Download of the bytes from offset to offset+length-1
// (length -1: to the end), asked with an HTTP Range header: WeChat serves
// media/get in ranges (206 Partial Content, Download.Partial); a server
// that ignores the header answers the whole file (200, Partial false).
// offset 0 and length -1 send no Range header.
func (c *Client) DownloadRange(ctx context.Context, api, path string, query url.Values, offset, length int64) (*Download, error) {
	if offset < 0 || length == 0 || length < -1 {
		return nil, fmt.Errorf("%s: invalid range: offset %d, length %d", api, offset, length)
	}
	rng := ""
	switch {
	case length > 0:
		rng = fmt.Sprintf("bytes=%d-%d", offset, offset+length-1)
	case offset > 0:
		rng = fmt.Sprintf("bytes=%d-", offset)
	}
	var d *Download
	err := c.callWithToken(ctx, api, func(ctx context.Context, tok string) (apiResult, error) {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("access_token", tok)
		var res apiResult
		var err error
		d, res, err = c.getOnce(ctx, path+"?"+q.Encode(), rng)
		return res, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api, err)
	}
	return d, nil
}

// getOnce sends one GET; a file answer is returned open, a JSON answer as
// its errcode.
func (c *Client) getOnce(ctx context.Context, pathAndQuery, rng string) (*Download, apiResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	headers := time.AfterFunc(c.cfg.Timeout, cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+pathAndQuery, nil)
	if err != nil {
		cancel()
		return nil, apiResult{}, fmt.Errorf("build request: %w", err)
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := c.hc.Do(req)
	if err != nil || !headers.Stop() {
		cancel()
		if err == nil {
			resp.Body.Close()
			err = context.DeadlineExceeded
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL carries the access token
		}
		return nil, apiResult{}, &transientError{fmt.Errorf("GET %s: %w", redactPath(pathAndQuery), err)}
	}
	if resp.StatusCode >= 500 || resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		resp.Body.Close()
		cancel()
		err := fmt.Errorf("GET %s: HTTP %d", redactPath(pathAndQuery), resp.StatusCode)
		if resp.StatusCode >= 500 {
			err = &transientError{err}
		}
		return nil, apiResult{}, err
	}
	ct := resp.Header.Get("Content-Type")
	_, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Disposition"))
	if params["filename"] == "" && isJSONAnswer(ct) {
		// WeChat answers an error as JSON without a Content-Disposition; a
		// file (even a .json one) always comes with one.
		defer cancel()
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		if err != nil {
			return nil, apiResult{}, &transientError{fmt.Errorf("read response: %w", err)}
		}
		var res apiResult
		if err := json.Unmarshal(data, &res); err != nil {
			return nil, apiResult{}, fmt.Errorf("decode response: %w", err)
		}
		if res.ErrCode == 0 {
			return nil, res, errors.New("a JSON answer without errcode where a file was expected")
		}
		return nil, res, nil
	}
	size := int64(-1)
	if n, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		size = n
	}
	d := &Download{Body: &cancelOnClose{resp.Body, cancel}, Size: size, ContentType: ct, FileName: params["filename"], Total: size}
	if resp.StatusCode == http.StatusPartialContent {
		d.Partial = true
		if d.Offset, d.Total, err = parseContentRange(resp.Header.Get("Content-Range")); err != nil {
			d.Body.Close()
			return nil, apiResult{}, fmt.Errorf("GET %s: %w", redactPath(pathAndQuery), err)
		}
	}
	return d, apiResult{}, nil
}

// parseContentRange reads "bytes first-last/total" (total "*": -1).
func parseContentRange(v string) (offset, total int64, err error) {
	bad := fmt.Errorf("206 answer with an unreadable Content-Range %q", v)
	spec, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, 0, bad
	}
	rng, tot, ok := strings.Cut(spec, "/")
	first, _, ok2 := strings.Cut(rng, "-")
	if !ok || !ok2 {
		return 0, 0, bad
	}
	if offset, err = strconv.ParseInt(first, 10, 64); err != nil || offset < 0 {
		return 0, 0, bad
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil || total < 0 {
			return 0, 0, bad
		}
	}
	return offset, total, nil
}

func isJSONAnswer(contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == "application/json" || mt == "text/plain" || strings.HasSuffix(mt, "+json")
}

// cancelOnClose releases the request's context with the body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
