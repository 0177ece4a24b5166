package wecomtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
)

// CallbackSender calls a callback URL the way WeChat does: signed query
// (msg_signature, timestamp, nonce), AES-encrypted XML body.
type CallbackSender struct {
	URL    string // the callback URL (handler under test)
	Token  string // callback token configured in the WeCom console
	AESKey string // EncodingAESKey, 43 characters
	CorpID string // receive ID
	// HTTPClient sends the requests; nil ⇒ http.DefaultClient.
	HTTPClient *http.Client
	// Clock gives the timestamp; nil ⇒ time.Now.
	Clock func() time.Time
}

func (s *CallbackSender) crypto() (*wecom.Crypto, error) {
	return wecom.NewCrypto(s.Token, s.AESKey, s.CorpID)
}

func (s *CallbackSender) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}

func (s *CallbackSender) client() *http.Client {
	if s.HTTPClient != nil {
		return s.HTTPClient
	}
	return http.DefaultClient
}

// SignedQuery returns the query WeChat would send for encrypted.
func (s *CallbackSender) SignedQuery(encrypted string) (url.Values, error) {
	c, err := s.crypto()
	if err != nil {
		return nil, err
	}
	ts := strconv.FormatInt(s.now().Unix(), 10)
	nonce := randNonce()
	return url.Values{"msg_signature": {c.Signature(ts, nonce, encrypted)}, "timestamp": {ts}, "nonce": {nonce}}, nil
}

// EventRequest builds the POST WeChat sends for a kf_msg_or_event callback.
func (s *CallbackSender) EventRequest(ctx context.Context, openKfID, token string) (*http.Request, error) {
	c, err := s.crypto()
	if err != nil {
		return nil, err
	}
	plain := wecom.MarshalEventXML(&wecom.Event{
		ToUserName: s.CorpID, CreateTime: s.now().Unix(), MsgType: "event",
		Event: wecom.EventKFMsgOrEvent, Token: token, OpenKfID: openKfID,
	})
	enc, err := c.Encrypt(plain)
	if err != nil {
		return nil, err
	}
	q, err := s.SignedQuery(enc)
	if err != nil {
		return nil, err
	}
	body := wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: s.CorpID, Encrypt: enc})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "text/xml")
	return req, nil
}

// SendEvent posts a kf_msg_or_event callback for openKfID with token.
// The caller closes the response body.
func (s *CallbackSender) SendEvent(ctx context.Context, openKfID, token string) (*http.Response, error) {
	req, err := s.EventRequest(ctx, openKfID, token)
	if err != nil {
		return nil, err
	}
	return s.client().Do(req)
}

// SendAccountAuthChange posts a kf_account_auth_change callback: the
// accounts added and removed. The caller closes the response body.
func (s *CallbackSender) SendAccountAuthChange(ctx context.Context, added, removed []string) (*http.Response, error) {
	c, err := s.crypto()
	if err != nil {
		return nil, err
	}
	plain := wecom.MarshalEventXML(&wecom.Event{ToUserName: s.CorpID, CreateTime: s.now().Unix(), MsgType: "event",
		Event: wecom.EventKFAccountAuthChange, AuthAdd: added, AuthDel: removed})
	enc, err := c.Encrypt(plain)
	if err != nil {
		return nil, err
	}
	q, err := s.SignedQuery(enc)
	if err != nil {
		return nil, err
	}
	body := wecom.MarshalEnvelopeXML(&wecom.Envelope{ToUserName: s.CorpID, Encrypt: enc})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "text/xml")
	return s.client().Do(req)
}

// VerifyURL makes WeChat's URL check: GET with echostr encrypted and
// signed. A correct handler answers the plain echostr. The caller closes
// the response body.
func (s *CallbackSender) VerifyURL(ctx context.Context, echostr string) (*http.Response, error) {
	c, err := s.crypto()
	if err != nil {
		return nil, err
	}
	enc, err := c.Encrypt([]byte(echostr))
	if err != nil {
		return nil, err
	}
	q, err := s.SignedQuery(enc)
	if err != nil {
		return nil, err
	}
	q.Set("echostr", enc)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("verify url: %w", err)
	}
	return s.client().Do(req)
}

// randNonce is a decimal nonce like WeChat's.
func randNonce() string {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<31))
	if err != nil {
		return strconv.FormatInt(time.Now().UnixNano()%(1<<31), 10)
	}
	return n.String()
}
