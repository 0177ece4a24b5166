package consumer

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/handler"
)

// The handler contract is package handler's; these are its names in the
// engine.
type (
	Handler         = handler.Handler
	HandlerFunc     = handler.HandlerFunc
	StateItem       = handler.StateItem
	ReplyLog        = handler.ReplyLog
	RetryAfterError = handler.RetryAfterError
)

// NoopHandler accepts every message and does nothing.
var NoopHandler Handler = HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error { return nil })

// LogHandler logs every message at info level.
func LogHandler(logger *zap.Logger) Handler {
	if logger == nil {
		logger = zap.NewNop()
	}
	return HandlerFunc(func(_ context.Context, m *chatmsg.ChatMessage) error {
		logger.Info("message",
			zap.String("user_id", m.ExternalUserID), zap.String("open_kfid", m.OpenKfID),
			zap.Int64("msg_id", m.MessageID), zap.String("upstream_msgid", m.UpstreamMsgID),
			zap.String("msg_type", m.MsgType))
		return nil
	})
}

// HTTPClient returns the client the http handler uses by default: up to
// maxConns connections to the receiver, all kept alive between messages.
// Go's default transport keeps 2 idle connections per host, so with more
// actors than that every burst opened (and closed) new connections — 348
// for 1,280 requests from 64 actors — until ephemeral ports run out at
// thousands of messages a second. The cap also bounds the requests in
// flight: an actor beyond it waits for a free connection.
func HTTPClient(maxConns int, timeout time.Duration) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxConns
	t.MaxIdleConnsPerHost = maxConns
	t.MaxConnsPerHost = maxConns
	t.IdleConnTimeout = 90 * time.Second
	return &http.Client{Timeout: timeout, Transport: t}
}

// ProtocolVersion is the version of the http handler's request protocol
// (docs/handler-protocol.md), sent as Kfpipe-Protocol.
const ProtocolVersion = "1"

// Signature returns the Kfpipe-Signature value of a request: "v1=" and the
// hex HMAC-SHA256, keyed by secret, of the Kfpipe-Timestamp value, a dot,
// and the body.
func Signature(secret, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

// maxRetryAfter caps a receiver's Retry-After: a longer pause is the
// DLQ's job (the message is dead-lettered after its attempts and retried
// with backoff).
const maxRetryAfter = time.Minute

// HTTPHandler POSTs each message as JSON to url (protocol 1,
// docs/handler-protocol.md). The request carries the message's dedup key
// as Idempotency-Key (a timed-out attempt may have had its effect; the
// retry has the same key) and, with a secret, a timestamp and an HMAC
// signature. Status: 2xx finishes the message; 408, 425, 429 and 503 are
// retried, after Retry-After when given; other 4xx are handler.Permanent (the
// receiver rejects this message); other 5xx, transport errors and timeouts
// are retried. timeout runs from when the request is sent (it got its
// connection), so a wait for a pooled connection never makes a call time
// out after the receiver did the work; a timed-out call's error wraps
// context.DeadlineExceeded. client nil means HTTPClient(64, 0).
func HTTPHandler(url string, timeout time.Duration, client *http.Client) Handler {
	return SignedHTTPHandler(url, timeout, client, "")
}

// SignedHTTPHandler is HTTPHandler signing each request with secret
// ("" means unsigned).
func SignedHTTPHandler(url string, timeout time.Duration, client *http.Client, secret string) Handler {
	return WebhookHandler(url, timeout, client, secret, nil)
}

// ResponseFunc receives the body of a 2xx answer of the http handler, with
// the message's context (not bounded by the request's timeout); its error
// is the message's (handler.Permanent included).
type ResponseFunc func(ctx context.Context, body []byte) error

// maxResponseBody bounds the 2xx body a ResponseFunc is given.
const maxResponseBody = 1 << 20

// WebhookHandler is SignedHTTPHandler handing each 2xx answer's body to
// respond (nil: the body is discarded). kfpipe sends the replies such a
// body carries (docs/handler-protocol.md). When respond fails with an
// error that is not permanent, the answer is kept and the message's next
// attempt hands it to respond again without calling the receiver (see
// answers): one 2xx answer, one effect.
func WebhookHandler(url string, timeout time.Duration, client *http.Client, secret string, respond ResponseFunc) Handler {
	if client == nil {
		client = HTTPClient(64, 0)
	}
	kept := newAnswers(time.Now)
	// answered hands a 2xx body to respond; when respond fails with an
	// error the next attempt may cure, the body is kept for that attempt
	// (answers): the receiver is not called twice for one message.
	answered := func(msgCtx context.Context, key string, data []byte) error {
		err := respond(msgCtx, data)
		if err != nil && !handler.IsPermanent(err) && !kept.keep(key, data) {
			return fmt.Errorf("%w (the answer could not be kept: the receiver is called again)", err)
		}
		return err
	}
	return HandlerFunc(func(msgCtx context.Context, m *chatmsg.ChatMessage) error {
		if respond != nil {
			if data, ok := kept.take(m.DedupKey()); ok {
				return answered(msgCtx, m.DedupKey(), data)
			}
		}
		body, err := chatmsg.Encode(m)
		if err != nil {
			return handler.Permanent(fmt.Errorf("encode: %w", err))
		}
		ctx := msgCtx
		var st *sendTimer
		if timeout > 0 {
			st = newSendTimer(msgCtx, timeout)
			defer st.stop()
			ctx = st.ctx
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return handler.Permanent(fmt.Errorf("http handler request: %w", err))
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", m.DedupKey())
		if tok, ok := handler.FencingToken(ctx); ok {
			// The partition lease's token, larger for every new owner of
			// the partition; a receiver can refuse a smaller one.
			req.Header.Set("Kfpipe-Fencing-Token", strconv.FormatInt(tok, 10))
		}
		req.Header.Set("Kfpipe-Protocol", ProtocolVersion)
		if secret != "" {
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			req.Header.Set("Kfpipe-Timestamp", ts)
			req.Header.Set("Kfpipe-Signature", Signature(secret, ts, body))
		}
		resp, err := client.Do(req)
		if err != nil {
			if st.expired() {
				return fmt.Errorf("http handler: no answer within %s of sending: %w", timeout, context.DeadlineExceeded)
			}
			return fmt.Errorf("http handler: %w", err)
		}
		defer resp.Body.Close()
		if c := resp.StatusCode; c >= 200 && c < 300 {
			if respond == nil {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody)) // reuse the connection
				return nil
			}
			data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
			if err != nil {
				if st.expired() {
					return fmt.Errorf("http handler: answer not read within %s of sending: %w", timeout, context.DeadlineExceeded)
				}
				return fmt.Errorf("http handler: read the answer: %w", err)
			}
			if len(data) > maxResponseBody {
				return handler.Permanent(fmt.Errorf("http handler: the answer is larger than %d bytes", maxResponseBody))
			}
			return answered(msgCtx, m.DedupKey(), data)
		}
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
		failure := fmt.Errorf("http handler: %s: %s", resp.Status, bytes.TrimSpace(snippet))
		switch c := resp.StatusCode; {
		case c == http.StatusRequestTimeout || c == http.StatusTooEarly || c == http.StatusTooManyRequests ||
			c == http.StatusServiceUnavailable:
			if d, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
				return &RetryAfterError{After: d, Err: failure}
			}
			return failure
		case c >= 400 && c < 500:
			return handler.Permanent(failure)
		default:
			return failure
		}
	})
}

// retryAfter reads a Retry-After value (seconds, or an HTTP date), capped
// at maxRetryAfter.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), maxRetryAfter), true
	}
	return 0, false
}

// NewHandler returns the built-in handler that cfg names; respond gets the
// http handler's 2xx answers (see WebhookHandler).
func NewHandler(cfg config.Handler, logger *zap.Logger, respond ResponseFunc) (Handler, error) {
	switch cfg.Type {
	case "log":
		return LogHandler(logger), nil
	case "noop":
		return NoopHandler, nil
	case "http":
		if cfg.HTTP.URL == "" {
			return nil, errors.New("handler.http.url must be set when handler.type is http")
		}
		// The client has no timeout of its own: handler.http.timeout runs
		// from the send (sendTimer), not from the wait for a connection.
		return WebhookHandler(cfg.HTTP.URL, cfg.HTTP.Timeout, HTTPClient(max(cfg.HTTP.MaxConns, 1), 0),
			cfg.HTTP.Secret, respond), nil
	default:
		return nil, fmt.Errorf("handler.type must be one of log, http, noop, got %q", cfg.Type)
	}
}

// sendTimer bounds a request from when it got its connection (the send),
// not from when it was made: the time a request waits for one of the
// pooled connections is not the receiver's.
type sendTimer struct {
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration

	mu    sync.Mutex
	timer *time.Timer
	fired bool
}

func newSendTimer(parent context.Context, timeout time.Duration) *sendTimer {
	st := &sendTimer{timeout: timeout}
	ctx, cancel := context.WithCancel(parent)
	st.cancel = cancel
	st.ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: st.start})
	return st
}

// start arms the timer at the first connection the request gets (the
// transport may send it again on another, within the same time).
func (st *sendTimer) start(httptrace.GotConnInfo) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.timer == nil {
		st.timer = time.AfterFunc(st.timeout, func() {
			st.mu.Lock()
			st.fired = true
			st.mu.Unlock()
			st.cancel()
		})
	}
}

// expired reports whether the timeout ended the request (false for nil).
func (st *sendTimer) expired() bool {
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.fired
}

func (st *sendTimer) stop() {
	st.mu.Lock()
	if st.timer != nil {
		st.timer.Stop()
	}
	st.mu.Unlock()
	st.cancel()
}
