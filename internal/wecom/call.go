package wecom

import (
	"context"
	"encoding/json"
	"fmt"
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
	var raw json.RawMessage
	err = c.callWithToken(ctx, api, func(ctx context.Context, tok string) (apiResult, error) {
		raw = nil
		if err := c.do(ctx, http.MethodPost, path+"?access_token="+url.QueryEscape(tok), body, &raw); err != nil {
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
