package judge

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// sent: user a has a0 a1 a2, user b has b0 b1, all sent at t0.
func sentSet() []Message {
	return []Message{
		{MsgID: "a0", User: "a", Index: 0, At: at(0)}, {MsgID: "a1", User: "a", Index: 1, At: at(0)},
		{MsgID: "a2", User: "a", Index: 2, At: at(0)}, {MsgID: "b0", User: "b", Index: 0, At: at(0)},
		{MsgID: "b1", User: "b", Index: 1, At: at(0)},
	}
}

// effects builds effects in arrival order from "msgid@ms" pairs.
func effects(pairs ...any) []Effect {
	var out []Effect
	for i := 0; i < len(pairs); i += 2 {
		id := pairs[i].(string)
		out = append(out, Effect{Seq: len(out), MsgID: id, User: id[:1], Tag: "c1", At: at(pairs[i+1].(int))})
	}
	return out
}

func TestJudge(t *testing.T) {
	tests := []struct {
		name      string
		effects   []Effect
		dead      map[string]bool
		explain   func(prev, next Effect) Cause
		effectsN  int
		lost      []string
		dup       int
		reordered []string
		recovered int
		unknown   int
	}{
		{name: "clean", effects: effects("a0", 1, "b0", 2, "a1", 3, "b1", 4, "a2", 5), effectsN: 5},
		{name: "lost", effects: effects("a0", 1, "a2", 3, "b0", 4, "b1", 5), effectsN: 4, lost: []string{"a1"}},
		{name: "a dead letter is not a loss", effects: effects("a0", 1, "a2", 3, "b0", 4, "b1", 5),
			dead: map[string]bool{"a1": true}, effectsN: 4},
		{name: "a second effect is a dup", effects: effects("a0", 1, "a1", 2, "a1", 3, "a2", 4, "b0", 5, "b1", 6),
			effectsN: 5, dup: 1},
		{name: "an explained second effect is not a dup", effects: effects("a0", 1, "a1", 2, "a1", 3, "a2", 4, "b0", 5, "b1", 6),
			explain: func(_, _ Effect) Cause { return Crash }, effectsN: 5},
		{name: "first effects out of order", effects: effects("a1", 1, "a0", 2, "a2", 3, "b0", 4, "b1", 5),
			effectsN: 5, reordered: []string{"a0"}},
		{name: "a redelivery after a later message is not a reorder",
			effects: effects("a0", 1, "a1", 2, "a0", 3, "a2", 4, "b0", 5, "b1", 6), effectsN: 5, dup: 1},
		{name: "a recovered dead letter may leave the order", effects: effects("a1", 1, "a2", 2, "a0", 3, "b0", 4, "b1", 5),
			dead: map[string]bool{"a0": true}, effectsN: 5, recovered: 1},
		{name: "an effect of a message never sent", effects: effects("a0", 1, "a1", 2, "a2", 3, "b0", 4, "b1", 5, "x9", 6, "x9", 7),
			effectsN: 5, unknown: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Judge(Input{Sent: sentSet(), Effects: tt.effects, Dead: tt.dead, Explain: tt.explain})
			if v.Effects != tt.effectsN || v.Dup() != tt.dup || v.Recovered != tt.recovered || len(v.Unknown) != tt.unknown {
				t.Fatalf("effects=%d dup=%d recovered=%d unknown=%d, want %d %d %d %d",
					v.Effects, v.Dup(), v.Recovered, len(v.Unknown), tt.effectsN, tt.dup, tt.recovered, tt.unknown)
			}
			if got := ids(v.Lost, func(m Message) string { return m.MsgID }); !equal(got, tt.lost) {
				t.Fatalf("lost %v, want %v", got, tt.lost)
			}
			if got := ids(v.Reordered, func(r Reorder) string { return r.MsgID }); !equal(got, tt.reordered) {
				t.Fatalf("reordered %v, want %v", got, tt.reordered)
			}
			wantOK := len(tt.lost) == 0 && tt.dup == 0 && len(tt.reordered) == 0 && tt.unknown == 0
			if v.OK() != wantOK {
				t.Fatalf("OK() = %v, want %v", v.OK(), wantOK)
			}
		})
	}
}

// TestJudgeWorstCause: a message repeated twice takes the worst cause of
// its repeats, so one unexplained repeat among explained ones is a dup.
func TestJudgeWorstCause(t *testing.T) {
	es := effects("a0", 1, "a0", 2, "a0", 3, "a1", 4, "a2", 5, "b0", 6, "b1", 7)
	v := Judge(Input{Sent: sentSet(), Effects: es, Explain: func(prev, _ Effect) Cause {
		if prev.At.Equal(at(1)) {
			return Crash
		}
		return Unexplained
	}})
	if v.Dup() != 1 || v.Count(Crash) != 0 || len(v.Repeats) != 1 || len(v.Repeats[0].Effects) != 3 {
		t.Fatalf("repeats %+v", v.Repeats)
	}
	v = Judge(Input{Sent: sentSet(), Effects: es, Explain: func(prev, _ Effect) Cause { return Failover }})
	if v.Dup() != 0 || v.Count(Failover) != 1 {
		t.Fatalf("repeats %+v", v.Repeats)
	}
}

func TestMaxUserStall(t *testing.T) {
	tests := []struct {
		name    string
		sent    []Message
		effects []Effect
		dead    map[string]bool
		want    time.Duration
		user    string
	}{
		{name: "each handled 100 ms after it was sent",
			sent:    []Message{{MsgID: "a0", User: "a", At: at(0)}, {MsgID: "a1", User: "a", Index: 1, At: at(1000)}},
			effects: effects("a0", 100, "a1", 1100), want: 100 * time.Millisecond, user: "a"},
		{name: "idle time between conversations is no stall",
			sent:    []Message{{MsgID: "a0", User: "a", At: at(0)}, {MsgID: "a1", User: "a", Index: 1, At: at(60000)}},
			effects: effects("a0", 50, "a1", 60070), want: 70 * time.Millisecond, user: "a"},
		{name: "a message held 5 s behind a slow one",
			sent: []Message{{MsgID: "a0", User: "a", At: at(0)}, {MsgID: "a1", User: "a", Index: 1, At: at(10)},
				{MsgID: "b0", User: "b", At: at(0)}},
			effects: effects("b0", 20, "a0", 3000, "a1", 8000), want: 5 * time.Second, user: "a"},
		{name: "a recovered dead letter waited until it was handled",
			sent:    []Message{{MsgID: "a0", User: "a", At: at(0)}, {MsgID: "b0", User: "b", At: at(0)}},
			effects: effects("b0", 10, "a0", 42000), dead: map[string]bool{"a0": true}, want: 42 * time.Second, user: "a"},
		{name: "a dead letter never handled does not wait",
			sent: []Message{{MsgID: "a0", User: "a", At: at(0)}, {MsgID: "a1", User: "a", Index: 1, At: at(30000)},
				{MsgID: "b0", User: "b", At: at(0)}},
			effects: effects("b0", 300, "a1", 30010), dead: map[string]bool{"a0": true}, want: 300 * time.Millisecond, user: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MaxUserStall(tt.sent, tt.effects, tt.dead)
			if got.Wait != tt.want || got.User != tt.user {
				t.Fatalf("stall %s of %q, want %s of %q", got.Wait, got.User, tt.want, tt.user)
			}
		})
	}
}

func ids[T any](xs []T, f func(T) string) []string {
	var out []string
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
