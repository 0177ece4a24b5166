package wecom

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// MaxSyncLimit is the largest page sync_msg returns.
const MaxSyncLimit = 1000

const (
	// tokenMargin is taken off expires_in so that a cached token is never
	// used in its last minutes, when clock skew could make it expire in
	// flight.
	tokenMargin = 5 * time.Minute
	// maxTries bounds attempts on transient failures (errcode -1,
	// transport errors, HTTP 5xx).
	maxTries = 3
	// maxResponseBytes bounds a response body: a full page of 1000 items
	// is a few MiB at most.
	maxResponseBytes = 32 << 20
)

// ClientConfig configures the WeChat Work API client.
type ClientConfig struct {
	BaseURL string // e.g. https://qyapi.weixin.qq.com
	CorpID  string
	Secret  string // the KF application secret
	// HTTPClient sends the requests; nil ⇒ a client with no timeout of its
	// own (Timeout bounds each request).
	HTTPClient *http.Client
	// Timeout bounds each HTTP request (not the retries together); 0 ⇒ 5 s.
	Timeout time.Duration
}

// Validate reports the first invalid field, named by its config key. The
// daemons' client settings were checked when the configuration loaded;
// this checks a ClientConfig built in code (package kf's New), with
// the settings' rule for a base URL (schema.IsHTTPURL).
func (c ClientConfig) Validate() error {
	switch {
	case strings.TrimSpace(c.BaseURL) == "":
		return errors.New("wecom.base_url must not be empty")
	case strings.TrimSpace(c.CorpID) == "":
		return errors.New("wecom.corp_id must not be empty")
	case strings.TrimSpace(c.Secret) == "":
		return errors.New("wecom.secret must not be empty")
	case c.Timeout < 0:
		return fmt.Errorf("wecom.request_timeout must be >= 0, got %s", c.Timeout)
	}
	if !schema.IsHTTPURL(c.BaseURL) {
		return fmt.Errorf("wecom.base_url must be an http(s) URL, got %q", c.BaseURL)
	}
	return nil
}

// TokenCache stores access tokens shared by every replica, so that they do
// not each call gettoken (which WeChat rate-limits). kf.TokenCache is this
// interface; RedisTokenCache is its one shared implementation.
type TokenCache interface {
	// Get returns the cached value and whether there was one.
	Get(ctx context.Context, key string) (string, bool, error)
	Set(ctx context.Context, key, val string, ttl time.Duration) error
	Del(ctx context.Context, key string) error
}

// RedisTokenCache is a TokenCache in Redis under prefix+"wecom:token:"+key.
type RedisTokenCache struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewRedisTokenCache returns a Redis token cache.
func NewRedisTokenCache(rdb redis.UniversalClient, prefix string) *RedisTokenCache {
	return &RedisTokenCache{rdb: rdb, prefix: prefix}
}

func (r *RedisTokenCache) key(k string) string { return r.prefix + "wecom:token:" + k }

// Get implements TokenCache.
func (r *RedisTokenCache) Get(ctx context.Context, key string) (string, bool, error) {
	v, err := r.rdb.Get(ctx, r.key(key)).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("token cache get: %w", err)
	}
	return v, true, nil
}

// Set implements TokenCache.
func (r *RedisTokenCache) Set(ctx context.Context, key, val string, ttl time.Duration) error {
	if err := r.rdb.Set(ctx, r.key(key), val, ttl).Err(); err != nil {
		return fmt.Errorf("token cache set: %w", err)
	}
	return nil
}

// Del implements TokenCache.
func (r *RedisTokenCache) Del(ctx context.Context, key string) error {
	if err := r.rdb.Del(ctx, r.key(key)).Err(); err != nil {
		return fmt.Errorf("token cache del: %w", err)
	}
	return nil
}

// MemoryTokenCache is a TokenCache for one process (tests, the demo).
type MemoryTokenCache struct {
	clock func() time.Time
	mu    sync.Mutex
	m     map[string]memToken
}

type memToken struct {
	val     string
	expires time.Time
}

// NewMemoryTokenCache returns an in-process cache; clock nil ⇒ time.Now.
func NewMemoryTokenCache(clock func() time.Time) *MemoryTokenCache {
	if clock == nil {
		clock = time.Now
	}
	return &MemoryTokenCache{clock: clock, m: make(map[string]memToken)}
}

// Get implements TokenCache.
func (c *MemoryTokenCache) Get(_ context.Context, key string) (string, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[key]
	if !ok || !c.clock().Before(t.expires) {
		return "", false, nil
	}
	return t.val, true, nil
}

// Set implements TokenCache.
func (c *MemoryTokenCache) Set(_ context.Context, key, val string, ttl time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[key] = memToken{val: val, expires: c.clock().Add(ttl)}
	return nil
}

// Del implements TokenCache.
func (c *MemoryTokenCache) Del(_ context.Context, key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
	return nil
}

// TokenFingerprint is the cache key of a (corp, secret) pair: the first 16
// hex characters of SHA-256(corp+secret), so the secret never appears in
// Redis and two KF apps of one corp get separate tokens.
func TokenFingerprint(corpID, secret string) string {
	sum := sha256.Sum256([]byte(corpID + secret))
	return hex.EncodeToString(sum[:])[:16]
}

// ClientOption configures NewClient.
type ClientOption func(*Client)

// WithClientLogger sets the logger (default: no-op).
func WithClientLogger(l *zap.Logger) ClientOption {
	return func(c *Client) {
		if l != nil {
			c.log = l
		}
	}
}

// WithClientRegisterer registers kfpipe_wecom_api_requests_total with r.
func WithClientRegisterer(r prometheus.Registerer) ClientOption {
	return func(c *Client) { c.reg = r }
}

// WithRetryBackoff sets the first wait between transient-failure retries
// (doubling after each); default 200 ms.
func WithRetryBackoff(d time.Duration) ClientOption {
	return func(c *Client) { c.backoff = d }
}

// Client calls the WeChat Work API with a shared, self-renewing access
// token. It is safe for concurrent use.
type Client struct {
	cfg      ClientConfig
	base     string
	hc       *http.Client
	tokens   TokenCache
	tokenKey string
	log      *zap.Logger
	reg      prometheus.Registerer
	backoff  time.Duration
	requests *prometheus.CounterVec

	// fetchMu makes concurrent callers of one process wait for a single
	// gettoken instead of each fetching one.
	fetchMu sync.Mutex
}

// maxConns is how many connections to WeChat a client opens at most.
const maxConns = 64

// NewClient returns a client. tokens nil ⇒ an in-process MemoryTokenCache
// (each replica then fetches its own token).
func NewClient(cfg ClientConfig, tokens TokenCache, opts ...ClientOption) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if tokens == nil {
		tokens = NewMemoryTokenCache(nil)
	}
	c := &Client{
		cfg: cfg, base: strings.TrimRight(cfg.BaseURL, "/"), hc: cfg.HTTPClient, tokens: tokens,
		tokenKey: TokenFingerprint(cfg.CorpID, cfg.Secret), log: zap.NewNop(), backoff: 200 * time.Millisecond,
	}
	if c.hc == nil {
		// Handlers reply concurrently (one call per busy user): at most
		// maxConns connections to WeChat, all kept when idle, so they are
		// reused, not redialled (the default keeps 2 idle per host: a reply
		// then cost ~10x the CPU, dialling), and calls beyond them wait.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxConnsPerHost, t.MaxIdleConns, t.MaxIdleConnsPerHost = maxConns, maxConns, maxConns
		c.hc = &http.Client{Transport: t}
	}
	for _, o := range opts {
		o(c)
	}
	c.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_wecom_api_requests_total",
		Help: "WeChat Work API calls by api and errcode (transport = no answer).",
	}, []string{"api", "code"})
	if c.reg != nil {
		if err := c.reg.Register(c.requests); err != nil {
			are := &prometheus.AlreadyRegisteredError{}
			if !errors.As(err, are) {
				return nil, fmt.Errorf("wecom: register metrics: %w", err)
			}
			c.requests = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return c, nil
}

// apiResult is the errcode/errmsg pair every response carries.
type apiResult struct {
	ErrCode int    `json:"errcode"`
	ErrMsg  string `json:"errmsg"`
}

func (r apiResult) err() error {
	if r.ErrCode == 0 {
		return nil
	}
	return &APIError{Code: r.ErrCode, Msg: r.ErrMsg}
}

type tokenResponse struct {
	apiResult
	AccessToken string `json:"access_token"`
	ExpiresIn   int64  `json:"expires_in"`
}

// AccessToken returns a valid access token, from the cache when possible.
// A cache that fails is logged and bypassed: WeChat stays reachable even
// when Redis is not.
func (c *Client) AccessToken(ctx context.Context) (string, error) {
	if tok, ok := c.cached(ctx); ok {
		return tok, nil
	}
	c.fetchMu.Lock()
	defer c.fetchMu.Unlock()
	if tok, ok := c.cached(ctx); ok {
		return tok, nil
	}
	q := url.Values{"corpid": {c.cfg.CorpID}, "corpsecret": {c.cfg.Secret}}
	var tr tokenResponse
	if err := c.withRetry(ctx, "gettoken", func(ctx context.Context) (apiResult, error) {
		tr = tokenResponse{}
		err := c.do(ctx, http.MethodGet, "/cgi-bin/gettoken?"+q.Encode(), nil, &tr)
		return tr.apiResult, err
	}); err != nil {
		return "", fmt.Errorf("gettoken: %w", err)
	}
	if tr.AccessToken == "" {
		return "", errors.New("gettoken: empty access_token")
	}
	ttl := time.Duration(tr.ExpiresIn)*time.Second - tokenMargin
	if tr.ExpiresIn <= 0 {
		ttl = 0
	} else if ttl <= 0 {
		ttl = time.Duration(tr.ExpiresIn) * time.Second / 2
	}
	if ttl > 0 {
		if err := c.tokens.Set(ctx, c.tokenKey, tr.AccessToken, ttl); err != nil {
			c.log.Warn("access token cache set", zap.Error(err))
		}
	}
	return tr.AccessToken, nil
}

func (c *Client) cached(ctx context.Context) (string, bool) {
	tok, ok, err := c.tokens.Get(ctx, c.tokenKey)
	if err != nil {
		c.log.Warn("access token cache get", zap.Error(err))
		return "", false
	}
	return tok, ok && tok != ""
}

// invalidate drops tok from the cache unless another caller already
// replaced it with a fresh one.
func (c *Client) invalidate(ctx context.Context, tok string) {
	cur, ok, err := c.tokens.Get(ctx, c.tokenKey)
	if err == nil && ok && cur != tok {
		return
	}
	if err := c.tokens.Del(ctx, c.tokenKey); err != nil {
		c.log.Warn("access token cache del", zap.Error(err))
	}
}

// callWithToken runs an API call with the access token, refetching the
// token once when WeChat says it is invalid or expired.
func (c *Client) callWithToken(ctx context.Context, api string, call func(ctx context.Context, token string) (apiResult, error)) error {
	for refreshed := false; ; refreshed = true {
		tok, err := c.AccessToken(ctx)
		if err != nil {
			return err
		}
		err = c.withRetry(ctx, api, func(ctx context.Context) (apiResult, error) { return call(ctx, tok) })
		if !refreshed && IsAccessTokenInvalid(err) {
			c.log.Info("access token rejected, refetching", zap.Error(err))
			c.invalidate(ctx, tok)
			continue
		}
		return err
	}
}

// withRetry runs call up to maxTries times while it fails transiently
// (errcode -1, transport error, HTTP 5xx), backing off exponentially.
func (c *Client) withRetry(ctx context.Context, api string, call func(ctx context.Context) (apiResult, error)) error {
	wait := c.backoff
	for try := 1; ; try++ {
		res, err := call(ctx)
		code := strconv.Itoa(res.ErrCode)
		if err != nil {
			code = "transport"
		}
		c.requests.WithLabelValues(api, code).Inc()
		if err == nil {
			err = res.err()
		}
		if err == nil {
			return nil
		}
		var te *transientError
		transient := errors.As(err, &te) || res.ErrCode == CodeSystemBusy
		if !transient || try >= maxTries || ctx.Err() != nil {
			return err
		}
		c.log.Debug("wecom api transient failure, retrying", zap.String("api", api), zap.Int("try", try), zap.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait *= 2
	}
}

// transientError is a failure worth retrying: no answer, or HTTP 5xx.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// do sends one request with a JSON body and decodes the JSON answer into
// out.
func (c *Client) do(ctx context.Context, method, pathAndQuery string, body []byte, out any) error {
	return c.doContent(ctx, method, pathAndQuery, "application/json", body, out)
}

// doContent is do with a body of contentType.
func (c *Client) doContent(ctx context.Context, method, pathAndQuery, contentType string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+pathAndQuery, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// *url.Error quotes the URL, which carries the access token or the
		// secret: keep only the cause so neither reaches a log.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return &transientError{fmt.Errorf("%s %s: %w", method, redactPath(pathAndQuery), err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return &transientError{fmt.Errorf("read response: %w", err)}
	}
	if resp.StatusCode >= 500 {
		return &transientError{fmt.Errorf("%s %s: HTTP %d", method, redactPath(pathAndQuery), resp.StatusCode)}
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d", method, redactPath(pathAndQuery), resp.StatusCode)
	}
	if len(data) > maxResponseBytes {
		return fmt.Errorf("response larger than %d bytes", maxResponseBytes)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

func redactPath(p string) string {
	if i := strings.IndexByte(p, '?'); i >= 0 {
		return p[:i]
	}
	return p
}

// SyncRequest is the body of sync_msg.
type SyncRequest struct {
	Cursor      string // "" ⇒ from the oldest message WeChat still has (3 days)
	Token       string // the callback's token; "" is allowed but strictly rate-limited
	Limit       int    // 1..1000; 0 ⇒ 1000
	VoiceFormat int    // 0 amr, 1 silk
	OpenKfID    string // required
}

// SyncResponse is one page of sync_msg.
type SyncResponse struct {
	NextCursor string
	HasMore    int
	// MsgList is the page's items that chatmsg.ParseItem read, in
	// WeChat's order: the records the producer sends to Kafka, without
	// MessageID and ProducedAt.
	MsgList []*chatmsg.ChatMessage
	// Invalid is the page's items ParseItem refused (not a JSON object;
	// no msgid, open_kfid or external_userid), with why.
	Invalid []*chatmsg.ItemError
}

// More reports whether another page follows. It can be true for a page
// with no messages: keep paging with NextCursor.
func (r *SyncResponse) More() bool { return r.HasMore == 1 }

type syncBody struct {
	Cursor      string `json:"cursor,omitempty"`
	Token       string `json:"token,omitempty"`
	Limit       int    `json:"limit,omitempty"`
	VoiceFormat int    `json:"voice_format,omitempty"`
	OpenKfID    string `json:"open_kfid"`
}

type syncResponse struct {
	apiResult
	NextCursor string            `json:"next_cursor"`
	HasMore    int               `json:"has_more"`
	MsgList    []json.RawMessage `json:"msg_list"`
}

// SyncMsg fetches one page of messages for req.OpenKfID after req.Cursor.
// API failures are *APIError (see IsTokenExpired, IsRateLimited,
// IsInvalidOpenKfID); an invalid access token is refetched once and errcode
// -1 is retried with backoff before an error is returned.
func (c *Client) SyncMsg(ctx context.Context, req SyncRequest) (*SyncResponse, error) {
	if req.OpenKfID == "" {
		return nil, errors.New("sync_msg: open_kfid must not be empty")
	}
	if req.Limit < 0 || req.Limit > MaxSyncLimit {
		return nil, fmt.Errorf("sync_msg: limit must be in [1, %d], got %d", MaxSyncLimit, req.Limit)
	}
	body, err := json.Marshal(syncBody(req))
	if err != nil {
		return nil, fmt.Errorf("sync_msg: %w", err)
	}
	var sr syncResponse
	err = c.callWithToken(ctx, "sync_msg", func(ctx context.Context, tok string) (apiResult, error) {
		sr = syncResponse{}
		err := c.do(ctx, http.MethodPost, "/cgi-bin/kf/sync_msg?access_token="+url.QueryEscape(tok), body, &sr)
		return sr.apiResult, err
	})
	if err != nil {
		return nil, fmt.Errorf("sync_msg %s: %w", req.OpenKfID, err)
	}
	out := &SyncResponse{NextCursor: sr.NextCursor, HasMore: sr.HasMore, MsgList: make([]*chatmsg.ChatMessage, 0, len(sr.MsgList))}
	for _, item := range sr.MsgList {
		m, err := chatmsg.ParseItem(item)
		var ie *chatmsg.ItemError
		switch {
		case err == nil:
			out.MsgList = append(out.MsgList, m)
		case errors.As(err, &ie):
			out.Invalid = append(out.Invalid, ie)
		default:
			return nil, fmt.Errorf("sync_msg %s: %w", req.OpenKfID, err)
		}
	}
	return out, nil
}
