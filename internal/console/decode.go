package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on what clients send.
const (
	maxIDLen       = 128
	maxUserLen     = 256
	maxReasonLen   = 1024
	maxFilterLen   = 64
	defaultLimit   = 50
	maxPageLimit   = 500
	maxBatchLimit  = 100000
	maxBlockPeriod = 366 * 24 * time.Hour
)

// decodeBody decodes the JSON body of r into v. An empty body leaves v as
// it is (the reason may come from the query). Unknown fields and trailing
// data are 400; a body over the cap is 413.
func decodeBody(r *http.Request, v any) *apiError {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("body larger than %d bytes", mbe.Limit)}
		}
		return badRequest("", "reading body: "+err.Error())
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return badRequest("", "body holds more than one JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "body holds trailing data after the JSON value")
	}
	return nil
}

// jsonError turns a decoding error into a 400 that names the field when
// encoding/json knows it.
func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		return badRequest(field, fmt.Sprintf("field %s must be %s, got %s", field, te.Type, te.Value))
	case errors.As(err, &se):
		return badRequest("", fmt.Sprintf("malformed JSON at byte %d", se.Offset))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "truncated JSON")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return badRequest(f, "unknown field "+strconv.Quote(f))
	}
	return badRequest("", "malformed JSON body")
}

// auditReason returns the body's reason, else the query's; it is required
// on every write.
// decodeWithReason decodes a write's JSON body into v, then returns its
// audit reason: *bodyReason (v's reason field, read after decoding) or the
// query's.
func decodeWithReason(r *http.Request, v any, bodyReason *string) (string, *apiError) {
	if e := decodeBody(r, v); e != nil {
		return "", e
	}
	return auditReason(*bodyReason, r.URL.Query())
}

func auditReason(body string, q url.Values) (string, *apiError) {
	reason := strings.TrimSpace(body)
	if reason == "" {
		reason = strings.TrimSpace(q.Get("reason"))
	}
	if reason == "" {
		return "", unprocessable("reason", "reason is required on every write: say why")
	}
	if len(reason) > maxReasonLen || !utf8.ValidString(reason) {
		return "", unprocessable("reason", fmt.Sprintf("reason must be valid UTF-8 of at most %d bytes", maxReasonLen))
	}
	return reason, nil
}

// identifier validates a user or message ID from the path or a filter.
func identifier(field, v string, maxLen int) *apiError {
	if v == "" {
		return badRequest(field, field+" must not be empty")
	}
	if len(v) > maxLen || !utf8.ValidString(v) || strings.IndexFunc(v, unicode.IsControl) >= 0 {
		return badRequest(field, fmt.Sprintf("%s must be printable UTF-8 of at most %d bytes", field, maxLen))
	}
	return nil
}

// checkFilter validates the user and failure-reason part of a DLQ filter,
// shared by the query (reads, 400) and the body (batch writes, 422).
func (s *base) checkFilter(f DLQFilter, status int) *apiError {
	if f.User != "" {
		if e := identifier("user", f.User, maxUserLen); e != nil {
			e.Status = status
			return e
		}
	}
	if f.Reason != "" {
		ok := len(f.Reason) <= maxFilterLen && strings.IndexFunc(f.Reason, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
		}) < 0
		if ok && len(s.cfg.Reasons) > 0 {
			ok = slices.Contains(s.cfg.Reasons, f.Reason)
		}
		if !ok {
			msg := "reason must be a failure reason such as rate_limited"
			if len(s.cfg.Reasons) > 0 {
				msg = "reason must be one of " + strings.Join(s.cfg.Reasons, ", ")
			}
			return &apiError{Status: status, Msg: msg, Field: "reason"}
		}
	}
	return nil
}

// queryFilter parses user, reason, review, cursor and limit from the query.
func (s *base) queryFilter(q url.Values, paged bool) (DLQFilter, *apiError) {
	f := DLQFilter{User: q.Get("user"), Reason: q.Get("reason")}
	if e := s.checkFilter(f, http.StatusBadRequest); e != nil {
		return f, e
	}
	if v := q.Get("review"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, badRequest("review", "review must be true or false")
		}
		f.Review = &b
	}
	if !paged {
		return f, nil
	}
	f.Cursor = q.Get("cursor")
	if len(f.Cursor) > 512 {
		return f, badRequest("cursor", "cursor too long")
	}
	lim, e := queryLimit(q)
	f.Limit = lim
	return f, e
}

func queryLimit(q url.Values) (int, *apiError) {
	v := q.Get("limit")
	if v == "" {
		return defaultLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPageLimit {
		return 0, badRequest("limit", fmt.Sprintf("limit must be an integer in [1, %d]", maxPageLimit))
	}
	return n, nil
}
