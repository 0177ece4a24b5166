package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/kfpipesim"
)

// TestSimulatorServicerTurnReachesTheModel runs the bot in the simulator
// (the whole pipeline in-process, kfpipe.History served from memory) with
// the fake model: the customer asks, a servicer answers from the page, the
// customer asks again — and the model's second request carries the
// servicer's words, between the customer's two messages.
func TestSimulatorServicerTurnReachesTheModel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator's embedded pipeline")
	}
	model := newFakeModel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- kfpipesim.Run(ctx, Bot(model.client(), 20), kfpipesim.WithAddr("127.0.0.1:0"), kfpipesim.WithOutput(out))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("simulator: %v", err)
		}
	})
	url := ""
	re := regexp.MustCompile(`chat with your bot at (http://\S+/)`)
	for deadline := time.Now().Add(90 * time.Second); url == ""; {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no simulator page within 90 s: %s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	send := func(as, text string) {
		t.Helper()
		body, _ := json.Marshal(map[string]string{"user": "sim-u1", "as": as, "text": text})
		resp, err := http.Post(url+"api/send", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("send %s %q: %d %s", as, text, resp.StatusCode, data)
		}
	}
	waitCalls := func(n int) [][]ChatMessage {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); ; {
			if c := model.calls(); len(c) >= n {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d model call(s) within 60 s, want %d", len(model.calls()), n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	send("customer", "Where is my parcel 123?")
	waitCalls(1)
	send("servicer", "It left our warehouse this morning.")
	// The servicer's message is handled (no model call) before the next
	// customer message: the simulator delivers a user's messages in order.
	send("customer", "Thanks, when will it arrive?")
	calls := waitCalls(2)
	var got []string
	for _, m := range calls[1] {
		got = append(got, m.Role+": "+m.Content)
	}
	want := []string{"system: " + systemPrompt, "user: Where is my parcel 123?", "assistant: answer 1",
		"assistant: [servicer servicer-1] It left our warehouse this morning.", "user: Thanks, when will it arrive?"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the second request's messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// syncBuffer is the simulator's output, read while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
