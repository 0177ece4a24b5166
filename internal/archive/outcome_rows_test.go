package archive

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/outcome"
)

// TestOutcomeRows: a record of the outcomes topic becomes one outcome row
// (handled, or recovered with its retry count) and one row per reply the
// customer got or WeChat refused — a reply found sent by an earlier run
// is sent, a failed one (retried with the message) is no row — each at
// the message's send time, so it sorts with the message it answers.
func TestOutcomeRows(t *testing.T) {
	sent := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := sent.Add(3 * time.Second)
	rec := outcome.Record{V: 1, MsgID: "m1", OpenKfID: "wk", User: "u1", SendTime: sent.Unix(), Retry: 2,
		Outcome: outcome.Recovered, At: at, Replies: []outcome.Reply{
			{N: 0, What: "reply", Outcome: "sent", MsgType: "text", Content: json.RawMessage(`{"msgtype":"text","text":{"content":"hi"}}`), At: at},
			{N: 1, What: "reply", Outcome: "skipped", MsgType: "text", At: at},
			{N: 2, What: "reply", Outcome: "failed", At: at},
			{N: 3, What: "reply", Outcome: "servicer_session", At: at},
			{N: 4, What: "welcome", Outcome: "refused", Error: "95001", At: at},
		}}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	rows := OutcomeRows(b, 3, 42, at.Add(time.Second))
	type want struct {
		kind   string
		seq    int
		reason string
	}
	wants := []want{{KindRecovered, 2, ""}, {KindReply, 0, ReplySent}, {KindReply, 1, ReplySent},
		{KindReply, 3, ReplyServicerSession}, {KindReply, 4, ReplyRefused}}
	if len(rows) != len(wants) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for i, w := range wants {
		r := rows[i]
		if r.Kind != w.kind || r.Seq != w.seq || r.Reason != w.reason || r.MsgID != "m1" || r.ExternalUserID != "u1" ||
			!r.At.Equal(sent) || r.Partition != 3 || r.Offset != 42 {
			t.Errorf("row %d: %+v, want %+v at the send time", i, r, w)
		}
		if r.Kind == KindReply && r.Origin != OriginBot {
			t.Errorf("row %d: origin %d, want OriginBot", i, r.Origin)
		}
	}
	if string(rows[1].Content) != `{"msgtype":"text","text":{"content":"hi"}}` || rows[1].MsgType != "text" {
		t.Errorf("the sent reply's content: %s %s", rows[1].MsgType, rows[1].Content)
	}
	if rows[4].Detail != "welcome 95001" {
		t.Errorf("the refused welcome's detail: %q", rows[4].Detail)
	}
	// A call that failed carries only its replies; an undecodable record
	// has no row.
	rec.Outcome, rec.Replies = "", rec.Replies[:1]
	b, _ = json.Marshal(rec)
	if rows := OutcomeRows(b, 0, 0, at); len(rows) != 1 || rows[0].Kind != KindReply {
		t.Errorf("a failed call's record: %+v, want its one reply", rows)
	}
	if rows := OutcomeRows([]byte("{"), 0, 0, at); len(rows) != 0 {
		t.Errorf("an undecodable record: %+v", rows)
	}
}
