package wecom

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
)

// Call POSTs in, as JSON, to the API at path ("/cgi-bin/kf/send_msg") with
// the access token, and decodes the answer into out (nil: only the errcode
// matters). A non-zero errcode is an *APIError; an invalid or expired
// access token is refetched once and errcode -1 retried with backoff, as
// for SyncMsg. api labels the request metric.
func (c *Client) Call(ctx context.Context, api, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("%s: %w", api, err)
	}
	return c.post(ctx, api, path, nil, "application/json", body, out)
}

// Upload POSTs data as the multipart/form-data file field "media" (named
// filename) to the API at path with query (the access token is added), as
// WeChat's media upload asks, and decodes the answer into out; errors and
// retries as for Call.
func (c *Client) Upload(ctx context.Context, api, path string, query url.Values, filename string, data []byte, out any) error {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormFile("media", filename)
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", api, err)
	}
	return c.post(ctx, api, path, query, mw.FormDataContentType(), buf.Bytes(), out)
}

// Get GETs the API at path with query (the access token is added), as
// WeChat's read-only calls such as kf/servicer/list ask, and decodes the
// answer into out; errors and retries as for Call.
func (c *Client) Get(ctx context.Context, api, path string, query url.Values, out any) error {
	return c.send(ctx, http.MethodGet, api, path, query, "", nil, out)
}

// post sends body to path with query and the access token, and decodes the
// answer into out.
func (c *Client) post(ctx context.Context, api, path string, query url.Values, contentType string, body []byte, out any) error {
	return c.send(ctx, http.MethodPost, api, path, query, contentType, body, out)
}

func (c *Client) send(ctx context.Context, method, api, path string, query url.Values, contentType string, body []byte, out any) error {
	var raw json.RawMessage
	err := c.callWithToken(ctx, api, func(ctx context.Context, tok string) (apiResult, error) {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("access_token", tok)
		raw = nil
		if err := c.doContent(ctx, method, path+"?"+q.Encode(), contentType, body, &raw); err != nil {
			return apiResult{}, err
		}
		var res apiResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return apiResult{}, fmt.Errorf("decode response: %w", err)
		}
		return res, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", api, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s: decode response: %w", api, err)
		}
	}
	return nil
}
