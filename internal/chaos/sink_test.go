package chaos

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"
)

// TestSinkLateAfterCancel: a call the consumer cancelled (a hand-over's
// drain limit) that the slowed receiver finishes anyway is recorded as
// late: the judge tells such a repeat from the pipeline's (the 30-minute
// nemesis, seed 347096448: a 20 s receiver, a 10 s drain, the next owner
// first). Without the flag it is an unexplained dup.
func TestSinkLateAfterCancel(t *testing.T) {
	s := NewSink(0)
	defer s.Close()
	s.Delay(func(string) time.Duration { return 300 * time.Millisecond })
	call := func(id string, cancelAfter time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), cancelAfter)
		defer cancel()
		body := []byte(`{"upstream_msgid":"` + id + `","open_kfid":"k","external_userid":"u"}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL("c.1"), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	call("kept", 5*time.Second)
	call("cancelled", 50*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := s.Len(); n < 2 && time.Now().Before(deadline); n, _ = s.Len() {
		time.Sleep(20 * time.Millisecond)
	}
	late := map[string]bool{}
	for _, d := range s.Deliveries() {
		late[d.MsgID] = d.Late
	}
	if len(late) != 2 || late["kept"] || !late["cancelled"] {
		t.Fatalf("late by msgid %v, want kept=false cancelled=true", late)
	}
}
