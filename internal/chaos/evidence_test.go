package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestReportCounts checks the judge itself on hand-made evidence, so a
// scenario that passes is known to be able to fail.
func TestReportCounts(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sent := []Sent{
		{MsgID: "a1", User: "a", Index: 0}, {MsgID: "a2", User: "a", Index: 1}, {MsgID: "a3", User: "a", Index: 2},
		{MsgID: "b1", User: "b", Index: 0}, {MsgID: "b2", User: "b", Index: 1},
	}
	d := func(seq int, id, tag string, ms int) Delivery {
		return Delivery{Seq: seq, MsgID: id, User: id[:1], Tag: tag, At: at(ms)}
	}
	// lateD: an effect made after its caller gave up on a request that
	// arrived at ms.
	lateD := func(d Delivery, ms int) Delivery { d.Late, d.Arrived = true, at(ms); return d }
	tests := []struct {
		name       string
		deliveries []Delivery
		dlq        map[string][]DeadLetter
		kills      []Kill
		want       Report
	}{
		{
			name:       "clean",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "b1", "c.1", 1), d(2, "a2", "c.1", 2), d(3, "a3", "c.1", 3), d(4, "b2", "c.1", 4)},
			want:       Report{Effects: 5},
		},
		{
			name:       "lost unless dead-lettered",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a3", "c.1", 3), d(2, "b1", "c.1", 4)},
			dlq:        map[string][]DeadLetter{"a2": {{MsgID: "a2", Reason: "downstream_error"}}},
			want:       Report{Effects: 3, DLQ: 1, Lost: 1}, // b2
		},
		{
			name: "second effect right before a kill of its process is explained",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 1000), d(2, "a2", "c.2", 5000),
				d(3, "a3", "c.2", 5001), d(4, "b1", "c.2", 5002), d(5, "b2", "c.2", 5003)},
			kills: []Kill{{Tag: "c.1", At: at(1050)}},
			want:  Report{Effects: 5, Redelivered: 1},
		},
		{
			name: "second effect without a kill of the process that made the first is a dup",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 1000), d(2, "a2", "c.2", 5000),
				d(3, "a3", "c.2", 5001), d(4, "b1", "c.2", 5002), d(5, "b2", "c.2", 5003)},
			kills: []Kill{{Tag: "c.3", At: at(1050)}},
			want:  Report{Effects: 5, Dup: 1},
		},
		{
			// A request sent before a freeze, answered by a slow receiver
			// 20 s into it: the frozen owner cannot mark it, the next
			// owner runs it again after the lease.
			name: "an effect stamped while its process was frozen is in flight at the freeze",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 21000), d(2, "a2", "c.2", 25000),
				d(3, "a3", "c.2", 25001), d(4, "b1", "c.2", 25002), d(5, "b2", "c.2", 25003)},
			kills: []Kill{{Tag: "c.1", At: at(1000), Freeze: true, Thaw: at(30000)}},
			want:  Report{Effects: 5, Redelivered: 1},
		},
		{
			// A zombie: what a resumed owner does after the thaw is its own.
			name: "an effect after the thaw is not excused by the freeze",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 36000), d(2, "a2", "c.2", 40000),
				d(3, "a3", "c.2", 40001), d(4, "b1", "c.2", 40002), d(5, "b2", "c.2", 40003)},
			kills: []Kill{{Tag: "c.1", At: at(1000), Freeze: true, Thaw: at(30000)}},
			want:  Report{Effects: 5, Dup: 1},
		},
		{
			name: "a kill long after the first effect does not explain a second",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 1000), d(2, "a2", "c.2", 20000),
				d(3, "a3", "c.2", 20001), d(4, "b1", "c.2", 20002), d(5, "b2", "c.2", 20003)},
			kills: []Kill{{Tag: "c.1", At: at(15000)}},
			want:  Report{Effects: 5, Dup: 1},
		},
		{
			name: "an effect stamped after its process's kill was in flight at the kill: explained",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 1300), d(2, "a2", "c.2", 11000),
				d(3, "a3", "c.2", 11001), d(4, "b1", "c.2", 11002), d(5, "b2", "c.2", 11003)},
			kills: []Kill{{Tag: "c.1", At: at(1000)}},
			want:  Report{Effects: 5, Redelivered: 1},
		},
		{
			name: "an effect stamped long after its process's kill cannot be its: a dup",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 4000), d(2, "a2", "c.2", 11000),
				d(3, "a3", "c.2", 11001), d(4, "b1", "c.2", 11002), d(5, "b2", "c.2", 11003)},
			kills: []Kill{{Tag: "c.1", At: at(1000)}},
			want:  Report{Effects: 5, Dup: 1},
		},
		{
			// The old owner's call, cancelled at the hand-over, reached a
			// slow receiver that finished it after the next owner's call
			// (the 30-minute nemesis, seed 347096448: a 20 s receiver, a
			// 10 s drain): the later effect is the late one.
			name: "a cancelled call the receiver finished after the next owner's is late, not a dup",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.2", 1000), lateD(d(2, "a2", "c.1", 5000), 500),
				d(3, "a3", "c.2", 5001), d(4, "b1", "c.2", 5002), d(5, "b2", "c.2", 5003)},
			want: Report{Effects: 5},
		},
		{
			// A late call that started after the first effect could have
			// found its mark: the pipeline's repeat.
			name: "a late repeat whose call started after the first effect is a dup",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.2", 1000), lateD(d(2, "a2", "c.1", 5000), 1500),
				d(3, "a3", "c.2", 5001), d(4, "b1", "c.2", 5002), d(5, "b2", "c.2", 5003)},
			want: Report{Effects: 5, Dup: 1},
		},
		{
			name: "a late first effect explains the repeat",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), lateD(d(1, "a2", "c.1", 1000), 900), d(2, "a2", "c.2", 5000),
				d(3, "a3", "c.2", 5001), d(4, "b1", "c.2", 5002), d(5, "b2", "c.2", 5003)},
			want: Report{Effects: 5},
		},
		{
			name:       "first effects out of WeChat order",
			deliveries: []Delivery{d(0, "a2", "c.1", 0), d(1, "a1", "c.1", 1), d(2, "a3", "c.1", 2), d(3, "b1", "c.1", 3), d(4, "b2", "c.1", 4)},
			want:       Report{Effects: 5, Reordered: 1},
		},
		{
			name:       "a dead-lettered message may leave the order",
			deliveries: []Delivery{d(0, "a2", "c.1", 0), d(1, "a3", "c.1", 1), d(2, "a1", "c.1", 2), d(3, "b1", "c.1", 3), d(4, "b2", "c.1", 4)},
			dlq:        map[string][]DeadLetter{"a1": {{MsgID: "a1", Reason: "rate_limited"}}},
			want:       Report{Effects: 5, DLQ: 1},
		},
		{
			name:       "a redelivery does not count as out of order",
			deliveries: []Delivery{d(0, "a1", "c.1", 0), d(1, "a2", "c.1", 10), d(2, "a1", "c.2", 4000), d(3, "a3", "c.2", 4001), d(4, "b1", "c.2", 4002), d(5, "b2", "c.2", 4003)},
			kills:      []Kill{{Tag: "c.1", At: at(20)}},
			want:       Report{Effects: 5, Redelivered: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &Evidence{Sent: sent, Deliveries: tt.deliveries, DLQ: tt.dlq, Kills: tt.kills, Lease: 3 * time.Second,
				Kafka: map[string]int{}}
			if ev.DLQ == nil {
				ev.DLQ = map[string][]DeadLetter{}
			}
			r := ev.Report("t", time.Second)
			got := Report{Effects: r.Effects, DLQ: r.DLQ, Lost: r.Lost, Dup: r.Dup, Reordered: r.Reordered, Redelivered: r.Redelivered}
			want := tt.want
			if got.Effects != want.Effects || got.DLQ != want.DLQ || got.Lost != want.Lost || got.Dup != want.Dup ||
				got.Reordered != want.Reordered || got.Redelivered != want.Redelivered {
				t.Fatalf("got %s\nwant effects=%d dlq=%d lost=%d dup=%d reordered=%d redelivered=%d\nnotes: %v",
					r.Line(), want.Effects, want.DLQ, want.Lost, want.Dup, want.Reordered, want.Redelivered, r.notes)
			}
			if r.OK() != (want.Lost == 0 && want.Dup == 0 && want.Reordered == 0) {
				t.Fatalf("OK() = %v for %s", r.OK(), r.Line())
			}
		})
	}
}

func TestReportLine(t *testing.T) {
	r := &Report{Name: "x", Sent: 3, Effects: 3, Duration: 1500 * time.Millisecond}
	r.Extra("outage", "10s")
	line := r.Line()
	for _, want := range []string{"scenario=x sent=3 effects=3 dlq=0 lost=0 dup=0 reordered=0 duration=1.5s ", " redelivered_after_kill=0", " outage=10s"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if strings.Count(line, "\n") != 0 {
		t.Errorf("line has a newline: %q", line)
	}
}

// TestMaxUserStall checks the stall figure on hand-made evidence: only
// users with a message waiting at a consumer kill count, from the kill to
// their next effect, and the limit turns a long stall into a problem; a
// kill with no user waiting on the victim is a problem too.
func TestMaxUserStall(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	sent := []Sent{
		{MsgID: "a1", User: "a", At: at(0)}, {MsgID: "a2", User: "a", At: at(1)},
		{MsgID: "b1", User: "b", At: at(0)}, {MsgID: "c1", User: "c", At: at(30)},
	}
	deliveries := []Delivery{
		{Seq: 0, MsgID: "a1", User: "a", Tag: "consumer-1.1", At: at(0.1)}, // a's partition: the victim's
		{Seq: 1, MsgID: "b1", User: "b", Tag: "consumer-2.1", At: at(0.2)}, // done before the kill: b does not count
		{Seq: 2, MsgID: "a2", User: "a", Tag: "consumer-2.1", At: at(14)},  // waiting at the kill (2 s): 12 s
		{Seq: 3, MsgID: "c1", User: "c", Tag: "consumer-2.1", At: at(30.1)},
	}
	ev := &Evidence{Sent: sent, Deliveries: deliveries, Kills: []Kill{{Tag: "consumer-1.1", At: at(2)}}, Lease: 10 * time.Second}
	if stall, victims, ok := ev.maxUserStall(); !ok || stall != 12*time.Second || len(victims) != 1 || victims[0].users != 1 {
		t.Fatalf("max stall = %v %v, victims %+v; want 12s, one user waiting on the victim", stall, ok, victims)
	}
	ev.StallLimit = 20 * time.Second
	if r := ev.Report("x", time.Minute); !r.OK() || !strings.Contains(r.Line(), "max_user_stall=12s") ||
		!strings.Contains(r.Line(), "users_waiting_on_victim=1") {
		t.Fatalf("within the limit: ok=%v line %q", r.OK(), r.Line())
	}
	// The same kill of the other consumer: a was waiting, but not on it.
	ev.Kills = []Kill{{Tag: "consumer-2.1", At: at(2)}}
	if r := ev.Report("x", time.Minute); r.OK() || !strings.Contains(r.Line(), "users_waiting_on_victim=0") {
		t.Fatalf("a kill with no user waiting on the victim passed: %q", r.Line())
	}
	ev.Kills = []Kill{{Tag: "consumer-1.1", At: at(2)}}
	ev.StallLimit = 10 * time.Second
	if r := ev.Report("x", time.Minute); r.OK() {
		t.Fatalf("a 12 s stall passed a 10 s limit: %q", r.Line())
	}
	ev.Kills = []Kill{{Tag: "producer.1", At: at(2)}}
	if _, _, ok := ev.maxUserStall(); ok {
		t.Fatal("a producer kill produced a consumer stall figure")
	}
}

// TestJudgeReplies checks the reply judge on hand-made evidence: a clean
// run passes; a missing reply, a repeat far from any kill, a reply out of
// the user's order, and a reply with a msgid kfpipe would not give are
// each a problem; a repeat right after a consumer kill is explained.
func TestJudgeReplies(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sent := []Sent{{MsgID: "a1", OpenKfID: "wk", User: "a", Index: 0}, {MsgID: "a2", OpenKfID: "wk", User: "a", Index: 1},
		{MsgID: "b1", OpenKfID: "wk", User: "b", Index: 0}}
	deliveries := []Delivery{{MsgID: "a1", User: "a", Tag: "consumer-1.1", At: at(0)},
		{MsgID: "b1", User: "b", Tag: "consumer-1.1", At: at(1)}, {MsgID: "a2", User: "a", Tag: "consumer-1.1", At: at(2)}}
	reply := func(id string, ms int) wecomtest.Reply {
		return wecomtest.Reply{OpenKfID: "wk", User: id[:1], MsgID: kf.MsgID("wk", id, 0), MsgType: "text",
			Body: []byte(`{"content":"` + ReplyText(id) + `"}`), At: at(ms)}
	}
	clean := []wecomtest.Reply{reply("a1", 10), reply("b1", 11), reply("a2", 12)}
	wrongID := reply("b1", 11)
	wrongID.MsgID = "other"
	tests := []struct {
		name          string
		replies, dups []wecomtest.Reply
		kills         []Kill
		deliveries    []Delivery // when set, instead of the shared ones
		problem       string     // "" when the run is clean
		extra         string
	}{
		{name: "clean", replies: clean, extra: "replies_missing=0 replies_dup=0 replies_resent_after_kill=0 replies_reordered=0"},
		{name: "missing", replies: clean[:2], problem: "1 missing"},
		{name: "repeat long after any kill", replies: clean, dups: []wecomtest.Reply{reply("a1", 30000)},
			kills: []Kill{{Tag: "consumer-1.1", At: at(20000)}}, problem: "1 sent twice"},
		// The kill leaves user a waiting on the victim (a2 handled after it,
		// by the next owner): a kill that tests a stall.
		{name: "repeat right after a kill", replies: clean, dups: []wecomtest.Reply{reply("a1", 13000)},
			kills: []Kill{{Tag: "consumer-1.1", At: at(500)}}, extra: "replies_resent_after_kill=1",
			deliveries: []Delivery{deliveries[0], deliveries[1], {MsgID: "a2", User: "a", Tag: "consumer-2.1", At: at(900)}}},
		// The fake stamps a reply on arrival: one the victim wrote just
		// before its kill arrives after it, and is resent by the next owner.
		{name: "repeat of a reply in flight at the kill", replies: []wecomtest.Reply{reply("a1", 600), reply("b1", 601), reply("a2", 1000)},
			dups: []wecomtest.Reply{reply("a1", 13000)}, kills: []Kill{{Tag: "consumer-1.1", At: at(415)}}, extra: "replies_resent_after_kill=1",
			deliveries: []Delivery{deliveries[0], deliveries[1], {MsgID: "a2", User: "a", Tag: "consumer-2.1", At: at(900)}}},
		{name: "repeat of a reply long after the kill", replies: []wecomtest.Reply{reply("a1", 3600), reply("b1", 3601), reply("a2", 4000)},
			dups: []wecomtest.Reply{reply("a1", 13000)}, kills: []Kill{{Tag: "consumer-1.1", At: at(500)}}, problem: "1 sent twice",
			deliveries: []Delivery{deliveries[0], deliveries[1], {MsgID: "a2", User: "a", Tag: "consumer-2.1", At: at(900)}}},
		{name: "out of order", replies: []wecomtest.Reply{reply("a2", 10), reply("b1", 11), reply("a1", 12)},
			problem: "1 out of order"},
		{name: "not kfpipe's msgid", replies: []wecomtest.Reply{clean[0], wrongID, clean[2]}, problem: "1 not asked for"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds := deliveries
			if tc.deliveries != nil {
				ds = tc.deliveries
			}
			e := &Evidence{Sent: sent, Deliveries: ds, Lease: 10 * time.Second, Kills: tc.kills, RepliesOn: true,
				Replies: tc.replies, ReplyDups: tc.dups}
			r := e.Report("t", time.Second)
			line := r.Line()
			if tc.problem == "" && !r.OK() {
				t.Fatalf("clean replies judged bad: %s %v", line, r.problems)
			}
			if tc.problem != "" && (r.OK() || !strings.Contains(strings.Join(r.problems, ";"), tc.problem)) {
				t.Fatalf("want problem %q, got %v (%s)", tc.problem, r.problems, line)
			}
			if !strings.Contains(line, tc.extra) {
				t.Fatalf("line %q lacks %q", line, tc.extra)
			}
		})
	}
}

// TestRepeatsCountsWithinABudget: an attempt re-injected twice is a
// repeat; an operator's batch retry, which starts the letter's retry_count
// again at 1 (a fresh budget), is not (the full dlq-kill9 run counted all
// 104 letters of its batch as re-injected twice before this).
func TestRepeatsCountsWithinABudget(t *testing.T) {
	for _, tc := range []struct {
		seq  []int
		want int
	}{
		{[]int{1, 2, 3}, 0},
		{[]int{1, 2, 3, 1}, 0},       // the operator's batch: a fresh budget
		{[]int{1, 2, 3, 1, 2, 3}, 0}, // and its own retries
		{[]int{1, 2, 2, 3}, 1},       // attempt 2 re-injected twice
		{[]int{1, 1}, 1},
		{[]int{1, 2, 3, 1, 1}, 1},
		{nil, 0},
	} {
		if got := repeats(tc.seq); got != tc.want {
			t.Errorf("repeats(%v) = %d, want %d", tc.seq, got, tc.want)
		}
	}
}
