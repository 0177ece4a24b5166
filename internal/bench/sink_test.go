package bench

import (
	"bytes"
	"encoding/json"
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
		{name: "handled and dead-lettered is recovered", handled: []string{"a0", "a1", "b0", "b1"}, dead: map[string]string{"b1": "queue_full"},
			want: Report{Handled: 4, Recovered: 1, DeadLettered: map[string]int{"queue_full": 1}}},
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
				got.OutOfOrder != tt.want.OutOfOrder || got.Recovered != tt.want.Recovered {
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

func post(t *testing.T, url string, m *chatmsg.ChatMessage) int {
	t.Helper()
	body, err := chatmsg.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func msgOf(id, user string) *chatmsg.ChatMessage {
	return &chatmsg.ChatMessage{UpstreamMsgID: id, OpenKfID: "wk", ExternalUserID: user}
}

// TestSinkFailUsers: a failing user's messages are answered 500 (and are
// no effect) until the admin endpoint switches the failure off; other
// users are served throughout.
func TestSinkFailUsers(t *testing.T) {
	l := NewLedger()
	var rec bytes.Buffer
	s := NewSink(l, SinkOptions{FailUsers: []string{"u1"}, Record: &rec})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	if c := post(t, srv.URL+"/sink", msgOf("m1", "u1")); c != http.StatusInternalServerError {
		t.Fatalf("failing user: status %d, want 500", c)
	}
	if c := post(t, srv.URL+"/sink", msgOf("m2", "u2")); c != http.StatusNoContent {
		t.Fatalf("other user: status %d, want 204", c)
	}
	resp, err := http.Post(srv.URL+"/fail?user=u1&on=false", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st SinkState
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(st.FailingUsers) != 0 || st.Answers500["u1"] != 1 || st.Handled != 1 {
		t.Fatalf("after /fail?user=u1&on=false: %d %+v", resp.StatusCode, st)
	}
	if c := post(t, srv.URL+"/sink", msgOf("m1", "u1")); c != http.StatusNoContent {
		t.Fatalf("fixed user: status %d, want 204", c)
	}
	resp, _ = http.Post(srv.URL+"/fail?user=u2&on=true", "", nil)
	resp.Body.Close()
	if c := post(t, srv.URL+"/sink", msgOf("m3", "u2")); c != http.StatusInternalServerError {
		t.Fatalf("user failed at runtime: status %d, want 500", c)
	}
	for _, bad := range []string{"/fail?user=u1", "/fail?on=true", "/fail?user=u1&all=true&on=true"} {
		resp, _ := http.Post(srv.URL+bad, "", nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("POST %s: status %d, want 400", bad, resp.StatusCode)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(rec.String()), "\n")
	var got []string
	for _, ln := range lines {
		var r RecordLine
		if err := json.Unmarshal([]byte(ln), &r); err != nil || r.At.IsZero() {
			t.Fatalf("record line %q: %v", ln, err)
		}
		got = append(got, r.MsgID+"/"+r.User)
	}
	if strings.Join(got, " ") != "m2/u2 m1/u1" {
		t.Fatalf("record %v, want the two effects in order (no failed attempt)", got)
	}
}

// TestSinkDownAndWindow: all=true makes everyone's messages 503 until
// switched off; a fail window does the same for its span only.
func TestSinkDownAndWindow(t *testing.T) {
	s := NewSink(nil, SinkOptions{FailWindows: []Window{{After: 300 * time.Millisecond, For: 400 * time.Millisecond}}})
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	if c := post(t, srv.URL+"/sink", msgOf("m1", "u1")); c != http.StatusNoContent {
		t.Fatalf("before the window: %d", c)
	}
	resp, _ := http.Post(srv.URL+"/fail?all=true&on=true", "", nil)
	resp.Body.Close()
	if c := post(t, srv.URL+"/sink", msgOf("m2", "u1")); c != http.StatusServiceUnavailable {
		t.Fatalf("down: %d, want 503", c)
	}
	s.SetDown(false)
	time.Sleep(time.Until(s.start.Add(400 * time.Millisecond)))
	if c := post(t, srv.URL+"/sink", msgOf("m3", "u1")); c != http.StatusServiceUnavailable {
		t.Fatalf("inside the window: %d, want 503", c)
	}
	time.Sleep(time.Until(s.start.Add(750 * time.Millisecond)))
	if c := post(t, srv.URL+"/sink", msgOf("m4", "u1")); c != http.StatusNoContent {
		t.Fatalf("after the window: %d, want 204", c)
	}
	if st := s.State(); st.Answers503 != 2 || st.Handled != 2 {
		t.Fatalf("state %+v", st)
	}
}

func TestSinkDelay(t *testing.T) {
	s := NewSink(nil, SinkOptions{Delay: 150 * time.Millisecond, Jitter: 50 * time.Millisecond})
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	start := time.Now()
	if c := post(t, srv.URL+"/sink", msgOf("m1", "u1")); c != http.StatusNoContent {
		t.Fatalf("status %d", c)
	}
	if el := time.Since(start); el < 150*time.Millisecond || el > 2*time.Second {
		t.Fatalf("answered after %s, want 150-200 ms", el)
	}
}

func TestParseWindow(t *testing.T) {
	if w, err := ParseWindow("30s@10s"); err != nil || w != (Window{After: 10 * time.Second, For: 30 * time.Second}) {
		t.Fatalf("30s@10s: %+v %v", w, err)
	}
	for _, bad := range []string{"30s", "0s@1s", "x@1s", "1s@-1s", "1s@y"} {
		if _, err := ParseWindow(bad); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}
