package console

import (
	"encoding/csv"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// exportFlushEvery bounds how much of an export sits in buffers before the
// client sees it.
const exportFlushEvery = 100

var csvHeader = []string{"id", "user", "open_kfid", "reason", "state", "failure_time", "retry_count",
	"next_retry_time", "source_topic", "source_partition", "source_offset", "details"}

// dlqExport streams the matching messages as CSV (header row first) or as
// JSON Lines (one DLQMessage object per line, application/x-ndjson): lines
// stream without holding the whole export, and a cut-off stream is visibly
// incomplete rather than an unterminated array.
//
// Headers are sent with the first row, so a store failure before it is
// still a JSON 503; a failure after it aborts the connection, which the
// client sees as a truncated transfer, not as a complete file.
func (s *letters) dlqExport(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	format := q.Get("format")
	if format == "" {
		format = "csv"
	}
	if format != "csv" && format != "json" {
		writeError(w, badRequest("format", "format must be csv or json"))
		return
	}
	f, e := s.queryFilter(q, false)
	if e != nil {
		writeError(w, e)
		return
	}
	flusher, _ := w.(http.Flusher)
	cw := csv.NewWriter(w)
	enc := json.NewEncoder(w)
	started, rows := false, 0
	start := func() {
		started = true
		name := "dlq-export-" + s.clock.Now().UTC().Format("20060102T150405Z")
		if format == "csv" {
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
			w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.csv"`)
			_ = cw.Write(csvHeader)
		} else {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.jsonl"`)
		}
	}
	err := s.dlq.Export(r.Context(), f, func(m DLQMessage) error {
		if !started {
			start()
		}
		var err error
		if format == "csv" {
			err = cw.Write(csvRow(m))
		} else {
			err = enc.Encode(m)
		}
		if err != nil {
			return err
		}
		if rows++; rows%exportFlushEvery == 0 {
			cw.Flush()
			if flusher != nil {
				flusher.Flush()
			}
		}
		return cw.Error()
	})
	if err != nil {
		if !started {
			writeError(w, s.storeError(err, "dlq.export"))
			return
		}
		s.log.Error("admin export aborted", zap.Int("rows", rows), zap.Error(err))
		panic(http.ErrAbortHandler)
	}
	if !started {
		start()
	}
	cw.Flush()
	s.log.Info("admin export", zap.String("who", principalFrom(r.Context()).name), zap.String("format", format),
		zap.Int("rows", rows))
}

func csvRow(m DLQMessage) []string {
	next := ""
	if m.NextRetryTime != nil {
		next = m.NextRetryTime.UTC().Format(time.RFC3339Nano)
	}
	return []string{csvCell(m.ID), csvCell(m.User), csvCell(m.OpenKfID), csvCell(m.Reason), csvCell(m.State),
		m.FailureTime.UTC().Format(time.RFC3339Nano), strconv.Itoa(m.RetryCount), next, csvCell(m.SourceTopic),
		strconv.FormatInt(int64(m.SourcePartition), 10), strconv.FormatInt(m.SourceOffset, 10), csvCell(m.Details)}
}

// csvCell defuses spreadsheet formulas: details and user IDs come from
// outside, and a cell starting with = + - @ would run when the export is
// opened in a spreadsheet.
func csvCell(v string) string {
	if v != "" && strings.ContainsRune("=+-@\t\r", rune(v[0])) {
		return "'" + v
	}
	return v
}
