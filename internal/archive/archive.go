// Package archive keeps the conversation in PostgreSQL: every main-topic
// message (customer, servicer and system-event alike) and every dead
// letter, one row each, in a table partitioned by day. It answers the
// three questions the console and handlers ask — a customer's
// conversation in a time window, one message by msgid, a KF account's
// recent traffic — for as long as archive.retention, where the main topic
// answers only for its newest records.
//
// The archiver (archiver.go) fills it from Kafka in a consumer group of
// its own; the store (store.go) writes batches with COPY and reads them
// back; the schema (schema.go) creates and drops the day partitions.
package archive

import (
	"encoding/json"
	"errors"
	"time"
)

// Kinds of rows.
const (
	// KindMessage is a main-topic message: a customer's, a servicer's
	// (origin 5) or a system event (origin 4).
	KindMessage = "message"
	// KindDeadLetter is a message's failure as the DLQ topic recorded it:
	// Reason is the dead-letter reason, Detail its details. Its MsgID is
	// the message's upstream msgid and Seq its retry count, so each
	// failure of a message is one row.
	KindDeadLetter = "dead_letter"
)

// ErrOff is returned by the readers of a Store opened with no DSN.
var ErrOff = errors.New("archive: not configured (archive.dsn is empty)")

// Row is one archived fact.
type Row struct {
	// At is when the message was sent (WeChat's send_time): the partition
	// key, stable across re-pulls and re-injections, so the same message
	// always lands on the same row.
	At time.Time
	// MsgID is the upstream msgid of the message the row is about.
	MsgID string
	// Kind is KindMessage or KindDeadLetter.
	Kind string
	// Seq tells apart rows of one kind about one message (a dead letter's
	// retry count); 0 for a message.
	Seq            int
	OpenKfID       string
	ExternalUserID string
	MsgType        string
	// Origin is WeChat's: 3 the customer, 4 a system event, 5 a servicer.
	Origin         int
	ServicerUserID string
	// Reason and Detail are a dead letter's failure reason and details.
	Reason string
	Detail string
	// Content is WeChat's message item as received (JSON).
	Content json.RawMessage
	// Partition and Offset are the main-topic record the row was read
	// from (for a dead letter: the record that failed).
	Partition int32
	Offset    int64
	// Recorded is the Kafka record's time: when the pipeline received
	// the message (for a dead letter, when it failed).
	Recorded time.Time
}
