package bench

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

func TestLedgerVerify(t *testing.T) {
	msg := func(id, user string) *chatmsg.ChatMessage {
		return &chatmsg.ChatMessage{UpstreamMsgID: id, OpenKfID: "wk", ExternalUserID: user}
	}
	tests := []struct {
		name    string
		handled []string // msgids, in handling order
		dead    map[string]string
		want    Report
	}{
		{name: "all handled in order", handled: []string{"a0", "b0", "a1", "b1"},
			want: Report{Handled: 4}},
		{name: "lost", handled: []string{"a0", "a1", "b0"},
			want: Report{Handled: 3, Lost: 1}},
		{name: "dead letter is not a loss", handled: []string{"a0", "a1", "b0"}, dead: map[string]string{"b1": "rate_limited"},
			want: Report{Handled: 3, DeadLettered: map[string]int{"rate_limited": 1}}},
		{name: "duplicate effect", handled: []string{"a0", "a1", "a1", "b0", "b1"},
			want: Report{Handled: 4, Duplicates: 1, OutOfOrder: 1}},
		{name: "handled and dead-lettered", handled: []string{"a0", "a1", "b0", "b1"}, dead: map[string]string{"b1": "queue_full"},
			want: Report{Handled: 4, Duplicates: 1}},
		{name: "reordered", handled: []string{"a1", "a0", "b0", "b1"},
			want: Report{Handled: 4, OutOfOrder: 1}},
		{name: "gap from a dead letter keeps order", handled: []string{"a0", "a2", "b0", "b1"}, dead: map[string]string{"a1": "circuit_open"},
			want: Report{Handled: 4, DeadLettered: map[string]int{"circuit_open": 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLedger()
			for _, u := range []string{"a", "b"} {
				for i := range 2 + map[bool]int{true: 1}[u == "a" && strings.Contains(tt.name, "gap")] {
					l.Sent(u+string(rune('0'+i)), u, i)
				}
			}
			for _, id := range tt.handled {
				l.Handled(msg(id, id[:1]), time.Now())
			}
			for id, reason := range tt.dead {
				l.DeadLettered(id, reason)
			}
			got := l.Verify()
			if got.Handled != tt.want.Handled || got.Lost != tt.want.Lost || got.Duplicates != tt.want.Duplicates ||
				got.OutOfOrder != tt.want.OutOfOrder {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for r, n := range tt.want.DeadLettered {
				if got.DeadLettered[r] != n {
					t.Fatalf("dead_lettered[%s] = %d, want %d", r, got.DeadLettered[r], n)
				}
			}
			wantOK := tt.want.Lost == 0 && tt.want.Duplicates == 0 && tt.want.OutOfOrder == 0
			if got.OK() != wantOK {
				t.Fatalf("OK() = %v, want %v", got.OK(), wantOK)
			}
		})
	}
}

func TestSinkHandler(t *testing.T) {
	l := NewLedger()
	l.Sent("m1", "u1", 0)
	srv := httptest.NewServer(l.SinkHandler())
	defer srv.Close()
	m := &chatmsg.ChatMessage{UpstreamMsgID: "m1", OpenKfID: "wk", ExternalUserID: "u1", ProducedAt: time.Now().UnixMilli()}
	body, _ := chatmsg.Encode(m)
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader(`{"upstream_msgid":""}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("invalid body: status %d, want 400 (the consumer treats 4xx as permanent)", resp.StatusCode)
	}
	if r := l.Verify(); !r.OK() || r.Handled != 1 {
		t.Fatalf("report %+v", r)
	}
	dl := `{"failure_reason":"rate_limited","original_message":{"upstream_msgid":"m2"}}`
	l.Sent("m2", "u1", 1)
	if err := l.AddDeadLetter([]byte(dl)); err != nil {
		t.Fatal(err)
	}
	if r := l.Verify(); r.DeadLettered["rate_limited"] != 1 || r.Lost != 0 {
		t.Fatalf("report %+v", r)
	}
}
