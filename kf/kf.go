// Package kf is the WeChat Work customer-service (微信客服) API that a
// handler needs to answer customers: send a message (send_msg), send the
// welcome message of a new session (send_msg_on_event), read and change a
// session's state (service_state/get, service_state/trans).
//
// Errors from WeChat are *Error values with the errcode. Retryable ones
// (-1 system busy, 45009 frequency limit) are retried by the client a few
// times with backoff; what is left is returned, and IsPermanent tells a
// refusal that retrying cannot fix (the 5-messages-in-48-hours reply
// window, an ended session, an unknown user) from a transient failure.
//
// Handlers running under kfpipe normally reply through kfpipe.Reply, which
// makes each reply an exactly-once effect; this client is the layer below.
package kf

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/kfpipe/kfpipe/internal/permanent"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Config configures a Client.
type Config struct {
	// BaseURL is WeChat Work's API ("https://qyapi.weixin.qq.com").
	BaseURL string
	// CorpID and Secret are the corp and the customer-service app's secret.
	CorpID, Secret string
	// Timeout bounds one HTTP request (default 5s).
	Timeout time.Duration
	// Tokens is where access tokens are kept, shared by every process of
	// the corp so they do not each call gettoken (which WeChat
	// rate-limits). nil keeps them in this process's memory. Consumers
	// run by kfpipe.RunConsumer use the same Redis cache as kf-producer.
	Tokens TokenCache
	// MediaRange is the size of the ranges GetMedia asks media/get for
	// (default MediaRangeBytes).
	MediaRange int64
}

// TokenCache stores access tokens under a key for a time to live:
//
//	Get(ctx context.Context, key string) (val string, ok bool, err error)
//	Set(ctx context.Context, key, val string, ttl time.Duration) error
//	Del(ctx context.Context, key string) error
//
// It is the one token cache interface of kfpipe (the WeChat client below
// uses the same), so the Redis cache the daemons share serves here too.
type TokenCache = wecom.TokenCache

// Client calls the customer-service API. It is safe for concurrent use.
type Client struct {
	c          *wecom.Client
	mediaRange int64
}

// New returns a Client. Access tokens are fetched on demand and cached in
// memory; a token WeChat rejects (40014, 42001) is refetched once.
func New(cfg Config) (*Client, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	wc := wecom.ClientConfig{BaseURL: cfg.BaseURL, CorpID: cfg.CorpID, Secret: cfg.Secret, Timeout: cfg.Timeout}
	if err := wc.Validate(); err != nil {
		return nil, fmt.Errorf("kf: %w", err)
	}
	var tokens wecom.TokenCache = wecom.NewMemoryTokenCache(nil)
	if cfg.Tokens != nil {
		tokens = cfg.Tokens
	}
	c, err := wecom.NewClient(wc, tokens)
	if err != nil {
		return nil, fmt.Errorf("kf: %w", err)
	}
	if cfg.MediaRange < 0 {
		return nil, fmt.Errorf("kf: MediaRange must not be negative, got %d", cfg.MediaRange)
	}
	if cfg.MediaRange == 0 {
		cfg.MediaRange = MediaRangeBytes
	}
	return &Client{c: c, mediaRange: cfg.MediaRange}, nil
}

// WeChat errcodes of the customer-service API that callers may want to
// tell apart (see IsPermanent for the classification).
const (
	CodeSystemBusy        = -1    // retryable
	CodeFrequencyLimit    = 45009 // retryable, with backoff
	CodeInvalidUser       = 40096 // the external_userid is not valid
	CodeInvalidOpenKfID   = 95000 // not a customer-service account of this corp
	CodeReplyLimit        = 95001 // 5 messages sent since the customer's last message
	CodeReplyWindowClosed = 95002 // more than 48 hours since the customer's last message
	CodeSessionEnded      = 95013 // the session has ended
	CodeInvalidTransition = 95016 // service_state/trans: this change of state is not allowed
	CodeWelcomeCodeUsed   = 95017 // send_msg_on_event: welcome_code (or msg_code) expired or already used
	CodeSessionInvalid    = 95018 // send_msg: the session's state does not allow it (a human servicer holds it)
	CodeInvalidMediaID    = 40007 // the media_id was not uploaded or has expired (3 days)
)

// Error is an errcode returned by WeChat.
type Error struct {
	API  string // "send_msg", …
	Code int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("kf %s: errcode %d: %s", e.API, e.Code, e.Msg) }

// Retryable reports whether the same call may succeed later: -1 (busy) and
// 45009 (frequency limit).
func (e *Error) Retryable() bool { return wecom.RetryableCode(e.Code) }

// Permanent reports whether retrying cannot fix e: any errcode that is not
// Retryable. It makes e a permanent error to kfpipe: a handler that
// returns it (wrapped or not) dead-letters its message at once, as
// kfpipe.Permanent does, instead of retrying it in a loop against the
// 5-in-48h window or an ended session.
func (e *Error) Permanent() bool { return wecom.PermanentCode(e.Code) }

// IsPermanent reports whether err is permanent: a WeChat refusal that
// retrying cannot fix (an *Error whose errcode is not Retryable), or an
// error marked with kfpipe.Permanent. It is kfpipe.IsPermanent: one
// notion of permanent across the handler, this client and the producer.
func IsPermanent(err error) bool { return permanent.Is(err) }

// IsRetryable reports whether err is a WeChat error worth retrying later.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable()
}

// IsThrottled reports whether err is one of WeChat's throttles: 45009
// (frequency limit), 45011 (called too often) or 45033 (too many
// concurrent calls). kfpipe's replies and media downloads cut the calls
// they make at once on it.
func IsThrottled(err error) bool {
	var e *Error
	return errors.As(err, &e) && wecom.ThrottleCode(e.Code)
}

// call runs one API call; it retries Retryable errcodes a few times (the
// client below already retries -1 within a call).
func (c *Client) call(ctx context.Context, api, path string, in, out any) error {
	wait := 200 * time.Millisecond
	for try := 1; ; try++ {
		var err error
		if u, ok := in.(uploadReq); ok {
			err = c.c.Upload(ctx, api, "/cgi-bin/media/upload", url.Values{"type": {u.mediaType}}, u.filename, u.data, out)
		} else if q, ok := in.(getReq); ok {
			err = c.c.Get(ctx, api, path, url.Values(q), out)
		} else {
			err = c.c.Call(ctx, api, path, in, out)
		}
		if err == nil {
			return nil
		}
		var ae *wecom.APIError
		if !errors.As(err, &ae) {
			return fmt.Errorf("kf %s: %w", api, err)
		}
		e := &Error{API: api, Code: ae.Code, Msg: ae.Msg}
		if !e.Retryable() || try >= 4 {
			return e
		}
		select {
		case <-ctx.Done():
			return e
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// uploadReq is a media upload's request, for call.
type uploadReq struct {
	mediaType, filename string
	data                []byte
}

type sendResult struct {
	MsgID string `json:"msgid"`
}

// Send sends m to the customer toUser of the account openKfID and returns
// WeChat's msgid. msgID, when not empty, is the msgid to give the message
// (at most 32 bytes of [0-9a-zA-Z_-]; MsgID derives one): kfpipe sends a
// reply with a msgid derived from what it answers, so a resend after a
// crash carries the same one.
func (c *Client) Send(ctx context.Context, openKfID, toUser, msgID string, m Message) (string, error) {
	if err := checkMsgID(msgID); err != nil {
		return "", err
	}
	if err := checkText(m); err != nil {
		return "", err
	}
	body := m.body()
	body["touser"], body["open_kfid"] = toUser, openKfID
	if msgID != "" {
		body["msgid"] = msgID
	}
	var r sendResult
	if err := c.call(ctx, "send_msg", "/cgi-bin/kf/send_msg", body, &r); err != nil {
		return "", err
	}
	return r.MsgID, nil
}

// SendOnEvent sends the message of a session event: the welcome message,
// with the welcome_code of its enter_session event, or the message of a
// change of state, with the msg_code TransServiceState returned (both
// valid 20 seconds, once). Only Text and Menu messages are allowed there.
func (c *Client) SendOnEvent(ctx context.Context, welcomeCode, msgID string, m Message) (string, error) {
	if err := checkMsgID(msgID); err != nil {
		return "", err
	}
	if t := m.msgType(); t != "text" && t != "msgmenu" {
		return "", fmt.Errorf("kf send_msg_on_event: %s messages are not allowed (text or msgmenu)", m.msgType())
	}
	body := m.body()
	body["code"] = welcomeCode
	if msgID != "" {
		body["msgid"] = msgID
	}
	var r sendResult
	if err := c.call(ctx, "send_msg_on_event", "/cgi-bin/kf/send_msg_on_event", body, &r); err != nil {
		return "", err
	}
	return r.MsgID, nil
}

// State is a session's service state.
type State int

// Session states, as WeChat numbers them.
const (
	StateUntreated State = 0 // not handled yet
	StateBot       State = 1 // handled by the smart assistant (a bot: your handler)
	StateQueue     State = 2 // waiting in the queue for a human servicer
	StateServicer  State = 3 // handled by a human servicer
	StateEnded     State = 4 // ended
)

// ServiceState returns the state of user's session with openKfID and, in
// StateServicer, the servicer's userid.
func (c *Client) ServiceState(ctx context.Context, openKfID, user string) (State, string, error) {
	var r struct {
		State    int    `json:"service_state"`
		Servicer string `json:"servicer_userid"`
	}
	err := c.call(ctx, "service_state/get", "/cgi-bin/kf/service_state/get",
		map[string]any{"open_kfid": openKfID, "external_userid": user}, &r)
	return State(r.State), r.Servicer, err
}

// TransServiceState changes the session's state: to StateServicer with the
// servicer's userid to hand the customer to a human, StateQueue to queue
// them, StateEnded to end the session. It returns the msg_code WeChat
// gives for a message about the change (send_msg_on_event).
func (c *Client) TransServiceState(ctx context.Context, openKfID, user string, to State, servicer string) (string, error) {
	in := map[string]any{"open_kfid": openKfID, "external_userid": user, "service_state": int(to)}
	if servicer != "" {
		in["servicer_userid"] = servicer
	}
	var r struct {
		MsgCode string `json:"msg_code"`
	}
	err := c.call(ctx, "service_state/trans", "/cgi-bin/kf/service_state/trans", in, &r)
	return r.MsgCode, err
}

// MsgID is the msgid kfpipe gives reply number index to the upstream
// message upstreamMsgID of openKfID: 32 characters of [0-9a-zA-Z_-]
// (base64url of a SHA-256 prefix), the same every time, so a resend of the
// same reply carries the same msgid.
func MsgID(openKfID, upstreamMsgID string, index int) string {
	h := sha256.Sum256([]byte(openKfID + "\x00" + upstreamMsgID + "\x00" + strconv.Itoa(index)))
	return base64.RawURLEncoding.EncodeToString(h[:24])
}

func checkMsgID(id string) error {
	if len(id) > 32 {
		return fmt.Errorf("kf: msgid %q is longer than 32 bytes", id)
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_' || r == '-') {
			return fmt.Errorf("kf: msgid %q may only hold [0-9a-zA-Z_-]", id)
		}
	}
	return nil
}

// Customer is a customer's profile (customer/batchget).
type Customer struct {
	ExternalUserID string `json:"external_userid"`
	Nickname       string `json:"nickname"`
	Avatar         string `json:"avatar"`
	Gender         int    `json:"gender"` // 0 unknown, 1 male, 2 female
	UnionID        string `json:"unionid"`
}

// MaxCustomersPerCall is how many external_userids customer/batchget
// takes at once; Customers splits longer lists.
const MaxCustomersPerCall = 100

// Customers returns the profiles of users, and the ids WeChat does not
// know (invalid_external_userid).
func (c *Client) Customers(ctx context.Context, users []string) ([]Customer, []string, error) {
	var found []Customer
	var invalid []string
	for start := 0; start < len(users); start += MaxCustomersPerCall {
		var r struct {
			List    []Customer `json:"customer_list"`
			Invalid []string   `json:"invalid_external_userid"`
		}
		batch := users[start:min(start+MaxCustomersPerCall, len(users))]
		if err := c.call(ctx, "customer/batchget", "/cgi-bin/kf/customer/batchget",
			map[string]any{"external_userid_list": batch, "need_enter_session_context": 0}, &r); err != nil {
			return found, invalid, err
		}
		found, invalid = append(found, r.List...), append(invalid, r.Invalid...)
	}
	return found, invalid, nil
}

// Media types of UploadMedia.
const (
	MediaImage = "image" // ≤ 10 MB, JPG or PNG
	MediaVoice = "voice" // ≤ 2 MB, AMR
	MediaVideo = "video" // ≤ 10 MB, MP4
	MediaFile  = "file"  // ≤ 20 MB
)

// UploadMedia uploads a temporary media file (kept by WeChat 3 days) and
// returns its media_id, for an Image message or a Link's or MiniProgram's
// ThumbMediaID. An upload is not an exactly-once effect (nothing reaches
// the customer), and each upload gets a new media_id: a handler that
// replies with what it uploads keeps the media_id with kfpipe.Memo, so it
// replies the same way when it runs again.
func (c *Client) UploadMedia(ctx context.Context, mediaType, filename string, data []byte) (string, error) {
	var r struct {
		MediaID string `json:"media_id"`
	}
	err := c.call(ctx, "media/upload", "", uploadReq{mediaType, filename, data}, &r)
	return r.MediaID, err
}
