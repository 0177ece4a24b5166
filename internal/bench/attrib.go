package bench

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Parts of the pipeline's Redis traffic, told apart by key prefix.
const (
	PartStore   = "store"   // the per-partition consumer state (<prefix>st:)
	PartLimiter = "limiter" // the rate limiter (<prefix>rl: or <prefix>{rl}:)
	PartLegacy  = "legacy"  // dedup.legacy: read, the old stores' keys (<prefix>dedup:)
	PartOther   = "other"   // everything else (status, DLQ, admin reads …)
)

// partOfKey tells which part of a consumer with Redis key prefix prefix a
// key belongs to.
func partOfKey(prefix, key string) string {
	rest, ok := strings.CutPrefix(key, prefix)
	switch {
	case !ok:
		return PartOther
	case strings.HasPrefix(rest, "st:"):
		return PartStore
	case strings.HasPrefix(rest, "rl:"), strings.HasPrefix(rest, "{rl}:"):
		return PartLimiter
	case strings.HasPrefix(rest, "dedup:"):
		return PartLegacy
	}
	return PartOther
}

// firstKey is the first key a command names, "" when it names none
// (EVAL/EVALSHA: the first of KEYS; others: the first argument).
func firstKey(args []any) string {
	if len(args) < 2 {
		return ""
	}
	name := strings.ToLower(argString(args[0]))
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 4 {
			return ""
		}
		if n, err := strconv.Atoi(argString(args[2])); err != nil || n < 1 {
			return ""
		}
		return argString(args[3])
	case "ping", "info", "time", "client", "hello", "select", "auth", "script", "publish",
		"subscribe", "psubscribe", "unsubscribe", "punsubscribe", "scan", "dbsize":
		return ""
	}
	return argString(args[1])
}

func argString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return ""
}

// callCounter is a go-redis hook counting the commands a client sends, per
// part (by key prefix) and command name, while it is on.
type callCounter struct {
	prefix string
	on     atomic.Bool
	mu     sync.Mutex
	calls  map[string]map[string]int64 // part -> command -> calls
}

func newCallCounter(prefix string) *callCounter {
	return &callCounter{prefix: prefix, calls: map[string]map[string]int64{}}
}

func (c *callCounter) count(cmds ...redis.Cmder) {
	if !c.on.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		args := cmd.Args()
		if len(args) == 0 {
			continue
		}
		name := strings.ToLower(argString(args[0]))
		if name == "multi" || name == "exec" {
			continue
		}
		part := PartOther
		if k := firstKey(args); k != "" {
			part = partOfKey(c.prefix, k)
		}
		m := c.calls[part]
		if m == nil {
			m = map[string]int64{}
			c.calls[part] = m
		}
		m[name]++
	}
}

// snapshot returns a copy of the counts.
func (c *callCounter) snapshot() map[string]map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[string]int64, len(c.calls))
	for p, m := range c.calls {
		cp := make(map[string]int64, len(m))
		for k, v := range m {
			cp[k] = v
		}
		out[p] = cp
	}
	return out
}

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds...)
		return next(ctx, cmds)
	}
}

// cmdStats are INFO commandstats figures of one command, or their delta.
type cmdStats struct {
	calls int64
	usec  int64
}

// partCost is what one part cost Redis over a phase, per message.
type partCost struct {
	// Calls per message: the part's own commands plus, when it alone
	// ran scripts, the commands its scripts made.
	Calls float64 `json:"calls_per_msg"`
	// ByCommand is Calls per command (script-internal ones included).
	ByCommand map[string]float64 `json:"calls_per_msg_by_command"`
	// CPUus is INFO commandstats usec per message of the part's own
	// commands (a script's usec covers its inner commands, which are not
	// added again): time executing commands, without the network I/O and
	// event loop that INFO cpu also counts.
	CPUus float64 `json:"cmd_usec_per_msg"`
	// Bytes is the MEMORY USAGE sum of the part's keys per message (-1:
	// not measured).
	Bytes float64 `json:"key_bytes_per_msg"`
}

// scriptCmds are the commands that run Lua on the server.
var scriptCmds = map[string]bool{"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true}

// scriptInner are the commands each part's scripts call (internal/state's
// and internal/ratelimit's Lua): a server call of one of them beyond the
// client's top-level calls is charged to the part whose script makes it.
var scriptInner = map[string][]string{
	PartStore:   {"hmget", "hset", "time", "sadd", "expire"},
	PartLimiter: {"get", "set", "zadd", "zremrangebyscore", "pexpire", "publish"},
}

// Parts that attribute may add besides the client's.
const (
	PartMixed     = "scripts (mixed)" // inner calls of scripts of several parts
	PartElsewhere = "not this client" // server calls neither sent nor made by a script of this client (another client sharing the Redis)
	PartTotal     = "total"           // the whole phase
)

// attribute splits a phase's server-side figures (server: INFO
// commandstats deltas per command) among the parts whose top-level calls
// the client counted (client: part -> command -> calls), per message
// over n messages:
//   - a part's calls are its top-level calls plus the internal calls of
//     its scripts: per command, the server's calls beyond every part's
//     top-level calls, charged to the one part that ran scripts and whose
//     scripts call that command (inner), to PartMixed when several
//     could have, and to PartElsewhere when none;
//   - a part's CPU is, per top-level command, its calls times that
//     command's usec per call on the server (EVALSHA's usec already holds
//     its inner commands, so inner calls add none);
//   - PartTotal is the whole phase: every server call, and the usec of
//     all the client's top-level calls.
func attribute(server map[string]cmdStats, client map[string]map[string]int64, inner map[string][]string, n float64) map[string]*partCost {
	out := map[string]*partCost{}
	get := func(p string) *partCost {
		c := out[p]
		if c == nil {
			c = &partCost{ByCommand: map[string]float64{}, Bytes: -1}
			out[p] = c
		}
		return c
	}
	top := map[string]int64{}
	ranScripts := map[string]bool{}
	for p, m := range client {
		for cmd, k := range m {
			top[cmd] += k
			if scriptCmds[cmd] && k > 0 {
				ranScripts[p] = true
			}
		}
	}
	perCall := func(cmd string) float64 {
		s := server[cmd]
		if s.calls <= 0 {
			return 0
		}
		return float64(s.usec) / float64(s.calls)
	}
	total := get(PartTotal)
	for p, m := range client {
		c := get(p)
		for cmd, k := range m {
			if k <= 0 {
				continue
			}
			c.Calls += float64(k)
			c.ByCommand[cmd] += float64(k)
			// The server may not have run all the client's calls (one
			// refused on the way): charge at most what it ran.
			us := float64(min(k, server[cmd].calls)) * perCall(cmd)
			c.CPUus += us
			total.CPUus += us
		}
	}
	for cmd, s := range server {
		if s.calls <= 0 {
			continue
		}
		total.Calls += float64(s.calls)
		total.ByCommand[cmd] += float64(s.calls)
		extra := s.calls - top[cmd]
		if extra <= 0 {
			continue
		}
		var cands []string
		for p := range ranScripts {
			for _, x := range inner[p] {
				if x == cmd {
					cands = append(cands, p)
					break
				}
			}
		}
		p := PartElsewhere
		switch len(cands) {
		case 0:
		case 1:
			p = cands[0]
		default:
			p = PartMixed
		}
		c := get(p)
		c.Calls += float64(extra)
		c.ByCommand[cmd] += float64(extra)
	}
	for _, c := range out {
		c.Calls = round(c.Calls/n, 3)
		c.CPUus = round(c.CPUus/n, 3)
		for k, v := range c.ByCommand {
			c.ByCommand[k] = round(v/n, 3)
		}
	}
	return out
}

// commandDelta is after - before per command, without the harness's own
// reads (INFO, SCAN, MEMORY USAGE).
func commandDelta(before, after map[string]cmdStats) map[string]cmdStats {
	out := map[string]cmdStats{}
	for cmd, a := range after {
		if cmd == "info" || cmd == "scan" || cmd == "memory|usage" {
			continue
		}
		b := before[cmd]
		d := cmdStats{calls: a.calls - b.calls, usec: a.usec - b.usec}
		if d.calls > 0 {
			out[cmd] = d
		}
	}
	return out
}
