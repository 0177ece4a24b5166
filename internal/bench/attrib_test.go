package bench

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestPartOfKey(t *testing.T) {
	const p = "kfpipe:"
	tests := map[string]string{
		"kfpipe:st:{main:3}:own":  PartStore,
		"kfpipe:rl:g:u1":          PartLimiter,
		"kfpipe:{rl}:b:u1":        PartLimiter,
		"kfpipe:dedup:u:D:u1:197": PartLegacy,
		"kfpipe:dlq:letters":      PartOther,
		"other:st:{main:3}:own":   PartOther,
		"":                        PartOther,
	}
	for key, want := range tests {
		if got := partOfKey(p, key); got != want {
			t.Errorf("partOfKey(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestCallCounterFirstKey(t *testing.T) {
	ctx := context.Background()
	c := newCallCounter("k:")
	c.count(redis.NewStringCmd(ctx, "get", "k:rl:g:u")) // off: not counted
	c.on.Store(true)
	c.count(
		redis.NewCmd(ctx, "evalsha", "abc", 2, "k:st:{t:0}:own", "k:st:{t:0}:d:1", "arg"),
		redis.NewCmd(ctx, "evalsha", "abc", 0, "arg"), // no key: other
		redis.NewBoolSliceCmd(ctx, "SMISMEMBER", "k:st:{t:0}:d:1", 1, 2),
		redis.NewStringCmd(ctx, "get", "k:rl:g:u"),
		redis.NewStringCmd(ctx, "get", "k:dedup:msg1"),
		redis.NewStatusCmd(ctx, "multi"),
		redis.NewStringCmd(ctx, "info", "cpu"),
	)
	got := c.snapshot()
	want := map[string]map[string]int64{
		PartStore:   {"evalsha": 1, "smismember": 1},
		PartLimiter: {"get": 1},
		PartLegacy:  {"get": 1},
		PartOther:   {"evalsha": 1, "info": 1},
	}
	if len(got) != len(want) {
		t.Fatalf("parts %v, want %v", got, want)
	}
	for p, m := range want {
		for cmd, n := range m {
			if got[p][cmd] != n {
				t.Errorf("%s %s = %d, want %d (all: %v)", p, cmd, got[p][cmd], n, got)
			}
		}
		if len(got[p]) != len(m) {
			t.Errorf("%s: %v, want %v", p, got[p], m)
		}
	}
}

func TestParseCmdStat(t *testing.T) {
	got := parseCmdStat("calls=12,usec=300,usec_per_call=25.00,rejected_calls=0,failed_calls=1")
	if got != (cmdStats{calls: 12, usec: 300}) {
		t.Fatalf("got %+v", got)
	}
	if got := parseCmdStat("garbage"); got != (cmdStats{}) {
		t.Fatalf("garbage: got %+v", got)
	}
}

func TestAttribute(t *testing.T) {
	// 100 messages. The store sent 10 EVALSHA (whose scripts made 10
	// HMGET, 10 HSET, 40 SADD) and 5 SMISMEMBER; the limiter 200 GET; the
	// legacy read 100 GET and 50 SISMEMBER; 3 ZADD came from another
	// client.
	server := map[string]cmdStats{
		"evalsha":    {calls: 10, usec: 500}, // 50 µs a call, inner ones included
		"hmget":      {calls: 10, usec: 20},
		"hset":       {calls: 10, usec: 30},
		"sadd":       {calls: 40, usec: 200},
		"smismember": {calls: 5, usec: 50},
		"get":        {calls: 300, usec: 600}, // 2 µs a call
		"sismember":  {calls: 50, usec: 100},
		"zadd":       {calls: 3, usec: 9},
	}
	client := map[string]map[string]int64{
		PartStore:   {"evalsha": 10, "smismember": 5},
		PartLimiter: {"get": 200},
		PartLegacy:  {"get": 100, "sismember": 50},
	}
	got := attribute(server, client, scriptInner, 100)
	check := func(part string, calls, cpu float64, by map[string]float64) {
		t.Helper()
		c := got[part]
		if c == nil {
			t.Fatalf("no part %s in %v", part, got)
		}
		if c.Calls != calls || c.CPUus != cpu {
			t.Errorf("%s: calls %v cpu %v, want %v %v", part, c.Calls, c.CPUus, calls, cpu)
		}
		for cmd, v := range by {
			if c.ByCommand[cmd] != v {
				t.Errorf("%s %s: %v, want %v", part, cmd, c.ByCommand[cmd], v)
			}
		}
		if len(c.ByCommand) != len(by) {
			t.Errorf("%s: by command %v, want %v", part, c.ByCommand, by)
		}
	}
	// Store: (10 + 5 + 10 + 10 + 40) / 100 calls; (500 + 50) / 100 µs —
	// the inner HMGET/HSET/SADD usec are not added again.
	check(PartStore, 0.75, 5.5, map[string]float64{"evalsha": 0.1, "smismember": 0.05, "hmget": 0.1, "hset": 0.1, "sadd": 0.4})
	check(PartLimiter, 2, 4, map[string]float64{"get": 2})
	check(PartLegacy, 1.5, 3, map[string]float64{"get": 1, "sismember": 0.5})
	check(PartElsewhere, 0.03, 0, map[string]float64{"zadd": 0.03})
	// Total: every server call; the usec of the client's top-level calls.
	check(PartTotal, 4.28, 12.5, map[string]float64{"evalsha": 0.1, "hmget": 0.1, "hset": 0.1, "sadd": 0.4,
		"smismember": 0.05, "get": 3, "sismember": 0.5, "zadd": 0.03})
}

func TestAttributeMixedScripts(t *testing.T) {
	// Both the store and the limiter ran scripts; HSET is only the
	// store's, GET could be the limiter's script's (its top-level GETs
	// are 10 of the 12), PUBLISH only the limiter's.
	server := map[string]cmdStats{
		"evalsha": {calls: 4, usec: 40},
		"hset":    {calls: 3, usec: 3},
		"get":     {calls: 12, usec: 12},
		"publish": {calls: 1, usec: 1},
	}
	client := map[string]map[string]int64{
		PartStore:   {"evalsha": 3},
		PartLimiter: {"evalsha": 1, "get": 10},
	}
	inner := map[string][]string{PartStore: {"hset", "get"}, PartLimiter: {"get", "publish"}}
	got := attribute(server, client, inner, 1)
	if c := got[PartStore]; c.Calls != 6 || c.ByCommand["hset"] != 3 || c.CPUus != 30 {
		t.Errorf("store: %+v", c)
	}
	if c := got[PartLimiter]; c.Calls != 12 || c.ByCommand["publish"] != 1 || c.CPUus != 20 {
		t.Errorf("limiter: %+v", c)
	}
	if c := got[PartMixed]; c == nil || c.Calls != 2 || c.ByCommand["get"] != 2 {
		t.Errorf("mixed: %+v", c)
	}
}

func TestStoreGoal(t *testing.T) {
	tests := []struct {
		c    *partCost
		want bool
	}{
		{&partCost{Bytes: 9, Calls: 1.1, CPUus: 2}, true},
		{&partCost{Bytes: 16.5, Calls: 1.1, CPUus: 2}, false},
		{&partCost{Bytes: 9, Calls: 1.6, CPUus: 2}, false},
		{&partCost{Bytes: 9, Calls: 1.1, CPUus: 3.2}, false},
		{&partCost{Bytes: -1, Calls: 1.1, CPUus: 2}, false}, // bytes not measured
		{nil, false},
	}
	for i, tt := range tests {
		if got := tt.c.pass(); got != tt.want {
			t.Errorf("%d: pass() = %v, want %v", i, got, tt.want)
		}
	}
}
