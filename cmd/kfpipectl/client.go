package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Exit codes; see the package documentation.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
	// exitNothing: the command ran, but nothing matched what it was asked
	// to act on (a retry whose filter selects no letter a retry may act
	// on); not an error, and not "done" either.
	exitNothing = 5
)

// nothingf ends a command that found nothing to act on (exit 5).
func nothingf(format string, a ...any) error {
	return &exitErr{code: exitNothing, msg: fmt.Sprintf(format, a...)}
}

// exitError is an error with the exit code it ends the command with.
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

func usagef(format string, a ...any) error {
	return &exitErr{code: exitUsage, msg: fmt.Sprintf(format, a...)}
}

func failf(format string, a ...any) error {
	return &exitErr{code: exitError, msg: fmt.Sprintf(format, a...)}
}

// codeOf maps an HTTP status to an exit code.
func codeOf(status int) int {
	switch {
	case status < 300:
		return exitOK
	case status == http.StatusNotFound:
		return exitNotFound
	case status == http.StatusUnauthorized, status == http.StatusForbidden, status == http.StatusConflict:
		return exitRefused
	case status == http.StatusBadRequest, status == http.StatusRequestEntityTooLarge, status == http.StatusUnprocessableEntity:
		return exitUsage
	}
	return exitError
}

// client calls the admin API with a bearer token.
type client struct {
	base  *url.URL
	token string
	http  *http.Client
}

func newClient(server, token string, timeout time.Duration) (*client, error) {
	u, err := url.Parse(strings.TrimRight(server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--server %q must be an http:// or https:// URL such as http://localhost:8090", server)
	}
	return &client{base: u, token: token, http: &http.Client{Timeout: timeout}}, nil
}

// apiErr is the API's error body.
type apiErr struct {
	Error string `json:"error"`
	Field string `json:"field"`
}

// do sends one request and returns the body of a 2xx answer; any other
// answer becomes an exitErr naming the status and the API's message.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	resp, err := c.send(ctx, method, path, query, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, failf("%s %s: reading the answer: %v", method, path, err)
	}
	if err := answerError(method, path, resp.StatusCode, data); err != nil {
		return nil, err
	}
	return data, nil
}

// send sends one request; the caller reads and closes the body.
func (c *client) send(ctx context.Context, method, path string, query url.Values, body any) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, failf("encoding the request: %v", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, failf("%s %s: %v", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, failf("%s %s: %v (is the dlq-consumer's admin API at %s?)", method, path, err, c.base)
	}
	return resp, nil
}

func answerError(method, path string, status int, data []byte) error {
	if status < 300 {
		return nil
	}
	var e apiErr
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		msg = e.Error
		if e.Field != "" {
			msg += " (field " + e.Field + ")"
		}
	}
	return &exitErr{code: codeOf(status), msg: fmt.Sprintf("%s %s: %d %s: %s", method, path, status, http.StatusText(status), msg)}
}

// onePage adds the limit and, when set, the cursor of a listing's page to
// q and returns it.
func onePage(q url.Values, limit int, cursor string) url.Values {
	q.Set("limit", strconv.Itoa(limit))
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q
}
