// Package archive keeps the conversation in PostgreSQL: every main-topic
// message (customer, servicer and system-event alike), every dead letter,
// every reply the bot sent and every message's outcome (handled,
// recovered; blocked and other failures are dead letters), one row each,
// in a table partitioned by day. It answers the
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
	// KindReply is a reply the bot made to the message MsgID: Seq is its
	// number in the handler call, Reason its outcome (ReplySent,
	// ReplyRefused, ReplyServicerSession), MsgType and Content the reply
	// as WeChat's message item, Detail a refusal's error. Origin is
	// OriginBot. One row per (msgid, reply number): the first outcome
	// recorded for it stays.
	KindReply = "reply"
	// KindHandled is a message's handler returning success; Seq is its
	// retry count (0: its first delivery).
	KindHandled = "handled"
	// KindRecovered is a message the DLQ re-injected being handled; Seq
	// is its retry count.
	KindRecovered = "recovered"
	// A message blocked (the user's limiter block) is a KindDeadLetter
	// row with Reason "user_blocked".
)

// Reply outcomes (a KindReply row's Reason).
const (
	// ReplySent: the customer got the reply (sent by this run, or found
	// sent by an earlier run of the handler for the message).
	ReplySent = "sent"
	// ReplyRefused: WeChat refused it for good (the 48-hour window, an
	// ended session, an unknown user).
	ReplyRefused = "refused"
	// ReplyServicerSession: skipped, a human servicer holds the session
	// (95018).
	ReplyServicerSession = "servicer_session"
)

// OriginBot is a KindReply row's Origin: a reply the bot sent through
// kfpipe. WeChat's own origins are 3 (customer), 4 (event), 5 (servicer).
const OriginBot = 10

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
	// Kind is KindMessage, KindDeadLetter, KindReply, KindHandled or
	// KindRecovered.
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
	// from (for a dead letter: the record that failed; for a reply or an
	// outcome: its record on the outcomes topic).
	Partition int32
	Offset    int64
	// Recorded is the Kafka record's time: when the pipeline received
	// the message (for a dead letter, when it failed).
	Recorded time.Time
}
