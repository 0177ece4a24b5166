package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"go.uber.org/zap"
)

// apiError is every error the API answers: {"error": ..., "field": ...}.
type apiError struct {
	Status int    `json:"-"`
	Msg    string `json:"error"`
	Field  string `json:"field,omitempty"`
	// CurrentVersion is the version a refused compare-and-set found.
	CurrentVersion *int64 `json:"current_version,omitempty"`
	challenge      string // WWW-Authenticate value for 401s
}

func (e *apiError) Error() string { return e.Msg }

func badRequest(field, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Msg: msg, Field: field}
}

func unprocessable(field, msg string) *apiError {
	return &apiError{Status: http.StatusUnprocessableEntity, Msg: msg, Field: field}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", e.challenge)
	}
	writeJSON(w, e.Status, e)
}

// storeError maps a store error to the client's answer; nil stays nil.
// Store failures are logged here and answered with a generic message: the
// detail may name internal hosts or keys.
func (s *base) storeError(err error, op string) *apiError {
	var conflict *VersionConflictError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &conflict):
		return &apiError{Status: http.StatusConflict, Msg: err.Error(), CurrentVersion: &conflict.Current}
	case errors.Is(err, ErrInvalidRules):
		return unprocessable("groups", err.Error())
	case errors.Is(err, ErrNotFound):
		return &apiError{Status: http.StatusNotFound, Msg: "not found"}
	case errors.Is(err, ErrConflict):
		return &apiError{Status: http.StatusConflict, Msg: err.Error()}
	case errors.Is(err, ErrBadCursor):
		return badRequest("cursor", "cursor was not issued by this API")
	case errors.Is(err, ErrUnknownGroup):
		return unprocessable("group", "unknown group")
	case errors.Is(err, context.Canceled):
		return &apiError{Status: http.StatusServiceUnavailable, Msg: "request cancelled"}
	}
	s.log.Error("admin store failure", zap.String("op", op), zap.Error(err))
	return &apiError{Status: http.StatusServiceUnavailable, Msg: "store unavailable, try again later"}
}

// resultOf names a failed operation's result for the audit entry.
func resultOf(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrUnknownGroup), errors.Is(err, ErrInvalidRules):
		return "invalid"
	}
	return "error"
}

// statusWriter records the status for metrics and keeps Flush working for
// the streamed export.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// discardWriter captures the mux's own 404/405 answer.
type discardWriter struct {
	header http.Header
	code   int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(b), nil
}
