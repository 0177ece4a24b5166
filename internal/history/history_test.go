package history

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

func msg(user, id string, at int64) *chatmsg.ChatMessage {
	return &chatmsg.ChatMessage{UpstreamMsgID: id, OpenKfID: "wk", ExternalUserID: user, MsgType: "text", Origin: 3, SendTime: at}
}

func ids(ts []Turn) string {
	s := ""
	for _, t := range ts {
		s += t.MsgID + " "
	}
	return s
}

// Memory keeps each conversation in send order (a late message in its
// place), once per msgid, its last perUser turns, and answers with the
// turns at or before a time, the one being handled left out.
func TestMemory(t *testing.T) {
	m := NewMemory(3, 2)
	ctx := context.Background()
	m.Record(msg("a", "a1", 10))
	m.Record(msg("a", "a3", 30))
	m.Record(msg("a", "a2", 20)) // late: a DLQ retry
	m.Record(msg("a", "a2", 20)) // again
	m.Record(msg("b", "b1", 15))
	got, _ := m.Last(ctx, "wk", "a", time.Unix(30, 0), "a3", 10)
	if ids(got) != "a1 a2 " {
		t.Fatalf("a before a3: %q", ids(got))
	}
	got, _ = m.Last(ctx, "wk", "a", time.Unix(20, 0), "", 1)
	if ids(got) != "a2 " {
		t.Fatalf("a's last 1 at 20: %q", ids(got))
	}
	m.Record(msg("a", "a4", 40))
	got, _ = m.Last(ctx, "wk", "a", time.Unix(99, 0), "", 10)
	if ids(got) != "a2 a3 a4 " {
		t.Fatalf("a's last 3 kept: %q", ids(got))
	}
	// A third user: the least recently active conversation (b) goes.
	m.Record(msg("c", "c1", 50))
	if got, _ = m.Last(ctx, "wk", "b", time.Unix(99, 0), "", 10); len(got) != 0 {
		t.Fatalf("b still kept: %q", ids(got))
	}
	if got, _ = m.Last(ctx, "other-kf", "a", time.Unix(99, 0), "", 10); len(got) != 0 {
		t.Fatalf("a on another account: %q", ids(got))
	}
}
