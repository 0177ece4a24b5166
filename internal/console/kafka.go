package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The Kafka around the pipeline: both topics with their brokers, leaders,
// in-sync replicas and the lag of the group that reads each (the
// schedule-consumers on the main topic, the dlq-consumers on the DLQ
// topic), and a read-only browser of the main topic by user (whose
// partition the key decides) or msgid and time. Nothing here writes or
// joins a group.

// KafkaSource is what the Kafka card reads; the daemon's pipeline view
// implements it (an optional capability of a Pipeline).
type KafkaSource interface {
	// KafkaContext describes the cluster and the two topics.
	KafkaContext(ctx context.Context) (KafkaContext, error)
	// TopicRecords reads one page of the main topic (RecordQuery).
	TopicRecords(ctx context.Context, q RecordQuery) (RecordPage, error)
}

// KafkaContext is the answer of GET /admin/kafka.
type KafkaContext struct {
	Brokers []KafkaBroker `json:"brokers"`
	Topics  []KafkaTopic  `json:"topics"`
	// Error says what could not be read (the rest answers).
	Error string `json:"error,omitempty"`
}

// KafkaBroker is one broker of the cluster's metadata.
type KafkaBroker struct {
	ID   int32  `json:"id"`
	Host string `json:"host"`
	Port int    `json:"port"`
}

// KafkaTopic is one of the pipeline's topics, its partitions and the group
// that reads it.
type KafkaTopic struct {
	Role       string           `json:"role"` // main or dlq
	Name       string           `json:"name"`
	Group      string           `json:"group"`
	LagTotal   int64            `json:"lag_total"`
	Partitions []KafkaPartition `json:"partitions"`
	Error      string           `json:"error,omitempty"`
}

// KafkaPartition is one partition: its replicas, the in-sync ones, and the
// reading group's offsets (committed -1: nothing committed).
type KafkaPartition struct {
	Partition int32   `json:"partition"`
	Leader    int32   `json:"leader"`
	Replicas  []int32 `json:"replicas"`
	ISR       []int32 `json:"isr"`
	End       int64   `json:"end_offset"`
	Committed int64   `json:"committed_offset"`
	Lag       int64   `json:"lag"`
}

// RecordQuery selects main-topic records: a user's (their partition), or
// an upstream msgid's (the user's partition when User is set, every
// partition otherwise), newer than Since, older than Before (an offset of
// the user's partition: the page before it), Limit at most.
type RecordQuery struct {
	User   string
	MsgID  string
	Since  time.Time
	Before int64 // -1: from the end
	Limit  int
}

// MainRecord is one main-topic record as the console shows it, wherever
// it was read: the topic browser, a customer's timeline (from the topic or
// the archive).
type MainRecord struct {
	Partition     int32     `json:"partition"`
	Offset        int64     `json:"offset"`
	Time          time.Time `json:"time"`
	UpstreamMsgID string    `json:"upstream_msgid,omitempty"`
	OpenKfID      string    `json:"open_kfid,omitempty"`
	MessageID     string    `json:"message_id,omitempty"`
	MsgType       string    `json:"msg_type,omitempty"`
	SendTime      int64     `json:"send_time,omitempty"`
	Preview       string    `json:"preview,omitempty"`
	// RetryFromDLQ: the DLQ re-injected this record (RetryCount-th retry).
	RetryFromDLQ bool `json:"retry_from_dlq,omitempty"`
	RetryCount   int  `json:"retry_count,omitempty"`
	// Invalid is why the value did not decode ("" when it did).
	Invalid string `json:"invalid,omitempty"`
}

// BrowsedRecord is one main-topic record with its key, headers and decoded
// message.
type BrowsedRecord struct {
	MainRecord
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers,omitempty"`
	// Message is the decoded message (the record's value, checked).
	Message json.RawMessage `json:"message,omitempty"`
}

// RecordPage is the answer of GET /admin/kafka/records, newest first.
type RecordPage struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"` // -1: every partition (a msgid alone)
	From      int64           `json:"from"`
	To        int64           `json:"to"`
	Records   []BrowsedRecord `json:"records"`
	// NextBefore is the Before of the next (older) page; absent after
	// the last.
	NextBefore *int64 `json:"next_before,omitempty"`
	// Note says why the read stopped short (a scan cap, an open
	// transaction).
	Note string `json:"note,omitempty"`
}

const (
	browseDefaultLimit = 20
	browseMaxLimit     = 200
	browseDefaultSince = 72 * time.Hour
)

func (s *kafkaView) kafkaSource(w http.ResponseWriter) (KafkaSource, bool) {
	src, ok := s.cfg.Pipeline.(KafkaSource)
	if !ok {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Msg: "not available: the admin API was started without the Kafka view"})
	}
	return src, ok
}

func (s *kafkaView) kafkaGet(w http.ResponseWriter, r *http.Request) {
	src, ok := s.kafkaSource(w)
	if !ok {
		return
	}
	kc, err := src.KafkaContext(r.Context())
	if err != nil && kc.Error == "" {
		kc.Error = err.Error()
	}
	if kc.Brokers == nil {
		kc.Brokers = []KafkaBroker{}
	}
	if kc.Topics == nil {
		kc.Topics = []KafkaTopic{}
	}
	writeJSON(w, http.StatusOK, kc)
}

func (s *kafkaView) kafkaRecords(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rq := RecordQuery{User: q.Get("user"), MsgID: q.Get("msgid"), Before: -1, Limit: browseDefaultLimit}
	if rq.User == "" && rq.MsgID == "" {
		writeError(w, badRequest("user", "give a user (external_userid) or a msgid"))
		return
	}
	for k, v := range map[string]string{"user": rq.User, "msgid": rq.MsgID} {
		if len(v) > maxFilterLen {
			writeError(w, badRequest(k, k+" too long"))
			return
		}
	}
	now := s.clock.Now().UTC()
	rq.Since = now.Add(-browseDefaultSince)
	if v := q.Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			rq.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			rq.Since = t
		} else {
			writeError(w, badRequest("since", fmt.Sprintf("since must be a duration back (e.g. 2h) or an RFC 3339 time, got %q", v)))
			return
		}
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, badRequest("before", fmt.Sprintf("before must be an offset (the next_before of the previous page), got %q", v)))
			return
		}
		if rq.User == "" {
			writeError(w, badRequest("before", "before pages a user's partition: give the user too"))
			return
		}
		rq.Before = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > browseMaxLimit {
			writeError(w, badRequest("limit", fmt.Sprintf("limit must be in [1, %d], got %q", browseMaxLimit, v)))
			return
		}
		rq.Limit = n
	}
	src, ok := s.kafkaSource(w)
	if !ok {
		return
	}
	page, err := src.TopicRecords(r.Context(), rq)
	if e := s.storeError(err, "kafka.records"); e != nil {
		writeError(w, e)
		return
	}
	if page.Records == nil {
		page.Records = []BrowsedRecord{}
	}
	writeJSON(w, http.StatusOK, page)
}
