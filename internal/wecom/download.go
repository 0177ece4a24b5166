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
}

// maxErrorBytes bounds the JSON error body of a download.
const maxErrorBytes = 64 << 10

// Download GETs the API at path with query and the access token, for the APIs
// that answer a file on success and a JSON errcode on failure (media/get).
// A non-zero errcode is an *APIError; tokens and transient failures are
// retried as for Call. The client's request timeout bounds the wait for
// the response's headers, not the reading of Body: ctx bounds that.
func (c *Client) Download(ctx context.Context, api, path string, query url.Values) (*Download, error) {
	var d *Download
	err := c.callWithToken(ctx, api, func(ctx context.Context, tok string) (apiResult, error) {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("access_token", tok)
		var res apiResult
		var err error
		d, res, err = c.getOnce(ctx, path+"?"+q.Encode())
		return res, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api, err)
	}
	return d, nil
}

// getOnce sends one GET; a file answer is returned open, a JSON answer as
// its errcode.
func (c *Client) getOnce(ctx context.Context, pathAndQuery string) (*Download, apiResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	headers := time.AfterFunc(c.cfg.Timeout, cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+pathAndQuery, nil)
	if err != nil {
		cancel()
		return nil, apiResult{}, fmt.Errorf("build request: %w", err)
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
	return &Download{Body: &cancelOnClose{resp.Body, cancel}, Size: size, ContentType: ct, FileName: params["filename"]},
		apiResult{}, nil
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
