package console

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func (f *fixture) rlCard(t *testing.T, user string) RateLimitCard {
	t.Helper()
	r := f.do(t, "Bearer "+viewerToken, "GET", "/admin/ratelimit/status/"+user, "")
	var c RateLimitCard
	if r.status != 200 || json.Unmarshal(r.body, &c) != nil {
		t.Fatalf("status of %s: %d %s", user, r.status, r.body)
	}
	return c
}

// TestBlockStory: the rate-limit card says when a block began, why and
// who: the limiter's refusal that began it (its violations), then an
// operator's block that replaced it; a block whose start is no longer
// kept says so; the whitelist shows.
func TestBlockStory(t *testing.T) {
	f := newFixture(t)
	f.dlq.mu.Lock()
	f.dlq.msgs = append(f.dlq.msgs,
		&DLQMessage{ID: "r1", User: "auto1", Reason: "rate_limited", State: "due", NextRetryTime: &t0,
			FailureTime: t0.Add(-11 * time.Minute), Details: "group normal: 2 consecutive violations"},
		&DLQMessage{ID: "r2", User: "auto1", Reason: "rate_limited", State: "due", NextRetryTime: &t0,
			FailureTime: t0.Add(-10 * time.Minute), Details: "group normal: 3 consecutive violations: blocked until 2025-03-01T12:50:00Z"},
		&DLQMessage{ID: "r3", User: "auto1", Reason: "user_blocked", State: "due", NextRetryTime: &t0,
			FailureTime: t0.Add(-9 * time.Minute), Details: "group normal: blocked until 2025-03-01T12:50:00Z"})
	f.dlq.mu.Unlock()
	f.rl.block["auto1"] = 50 * time.Minute

	c := f.rlCard(t, "auto1")
	cur := c.BlockStory.Current
	if !c.Blocked || cur == nil || cur.Kind != "automatic" || cur.Letter != "r2" || !cur.Time.Equal(t0.Add(-10*time.Minute)) ||
		!strings.Contains(cur.Why, "3 consecutive violations") || len(c.BlockStory.Events) != 1 {
		t.Fatalf("automatic block: %+v", c.BlockStory)
	}

	if r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/ratelimit/block/auto1", `{"reason":"abuse on the phone","duration":"24h"}`); r.status != 200 {
		t.Fatalf("block: %d %s", r.status, r.body)
	}
	c = f.rlCard(t, "auto1")
	cur = c.BlockStory.Current
	if cur == nil || cur.Kind != "operator" || cur.Who != "alice" || cur.Why != "abuse on the phone" || cur.AuditID == "" ||
		len(c.BlockStory.Events) != 2 || c.BlockStory.Events[1].Kind != "automatic" {
		t.Fatalf("operator's block: %+v", c.BlockStory)
	}

	if r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/ratelimit/unblock/auto1", `{"reason":"sorted"}`); r.status != 200 {
		t.Fatalf("unblock: %d %s", r.status, r.body)
	}
	c = f.rlCard(t, "auto1")
	if c.Blocked || c.BlockStory.Current != nil || c.BlockStory.Events[0].Action != "unblock" {
		t.Fatalf("after the unblock: %+v", c.BlockStory)
	}

	c = f.rlCard(t, "bad1") // blocked, nothing kept of how
	if !c.Blocked || c.BlockStory.Current != nil || !strings.Contains(c.BlockStory.Note, "no longer kept") {
		t.Fatalf("a block of unknown start: %+v", c.BlockStory)
	}

	if r := f.do(t, "Bearer "+operatorToken, "POST", "/admin/ratelimit/whitelist/vip1", `{"reason":"partner"}`); r.status != 200 {
		t.Fatalf("whitelist: %d %s", r.status, r.body)
	}
	if c = f.rlCard(t, "vip1"); !c.BlockStory.Whitelisted || c.BlockStory.Events[0].Action != "whitelist_add" || c.BlockStory.Events[0].Who != "alice" {
		t.Fatalf("whitelisted: %+v", c)
	}
}
