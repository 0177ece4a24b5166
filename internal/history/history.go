// Package history serves handlers the turns of a customer's conversation
// before the message being handled (kfpipe.History): from the conversation
// archive in production, from memory in the test kit, the simulator and
// the demo, which run with no database.
package history

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/outcome"
)

// ErrNone is returned when no history source is configured (no
// archive.dsn, and not the test kit, simulator or demo).
var ErrNone = errors.New("kfpipe: no conversation history: set archive.dsn (the conversation archive)")

// Turn is one turn of a conversation: a customer's message, a servicer's
// or a system event, as WeChat delivered it, or a reply of the bot
// (archive.OriginBot; its MsgID is the message it answered).
type Turn struct {
	MsgID string
	// Origin is WeChat's: 3 the customer, 4 a system event, 5 a servicer;
	// or archive.OriginBot, a reply of the bot.
	Origin int
	// Servicer is the servicer who wrote it (origin 5).
	Servicer string
	MsgType  string
	SendTime time.Time
	// Content is WeChat's message item as received (JSON); a reply's as
	// sent.
	Content json.RawMessage
	id      string // Memory's: the message's msgid, a reply's msgid and number
}

// Source reads a conversation's turns.
type Source interface {
	// Last returns the last n turns of user's conversation on the KF
	// account openKfID sent at or before before, leaving out the message
	// exclude (the one being handled), oldest first.
	Last(ctx context.Context, openKfID, user string, before time.Time, exclude string, n int) ([]Turn, error)
}

// recorder is a Source that learns the conversation from the messages
// the handler is given (Memory).
type recorder interface{ record(m *chatmsg.ChatMessage) }

type contextKey struct{}

// With returns ctx carrying s.
func With(ctx context.Context, s Source) context.Context {
	return context.WithValue(ctx, contextKey{}, s)
}

// From returns the Source ctx carries (nil none).
func From(ctx context.Context) Source {
	s, _ := ctx.Value(contextKey{}).(Source)
	return s
}

// Wrap gives h's calls s in their context; a Memory also records each
// message (every message of a batch) before h sees it.
func Wrap(h handler.Handler, s Source) handler.Handler {
	if s == nil {
		return h
	}
	rec, _ := s.(recorder)
	mem, _ := s.(*Memory)
	return handler.HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if rec != nil {
			if b := handler.BatchFrom(ctx); len(b) > 0 {
				for _, it := range b {
					rec.record(it.Msg)
				}
			} else {
				rec.record(m)
			}
		}
		if mem != nil {
			ctx = mem.Replies(ctx, m)
		}
		return h.Handle(With(ctx, s), m)
	})
}

// Archive is the Source of the conversation archive.
func Archive(s *archive.Store) Source { return archiveSource{s} }

type archiveSource struct{ s *archive.Store }

func (a archiveSource) Last(ctx context.Context, openKfID, user string, before time.Time, exclude string, n int) ([]Turn, error) {
	rows, err := a.s.LastTurns(ctx, openKfID, user, before, exclude, n)
	if err != nil {
		return nil, err
	}
	out := make([]Turn, len(rows))
	for i, r := range rows {
		out[i] = Turn{MsgID: r.MsgID, Origin: r.Origin, Servicer: r.ServicerUserID, MsgType: r.MsgType,
			SendTime: r.At, Content: r.Content}
	}
	return out, nil
}

// Memory is a Source kept in memory from the messages the handler is
// given: the last PerUser turns of at most Users conversations (the
// least recently active forgotten first). For one process with no
// database — the test kit, the simulator, the demo — never a fleet of
// consumers: each would know only the users of its own partitions since
// it started.
type Memory struct {
	mu      sync.Mutex
	perUser int
	users   int
	convs   map[string]*conv
}

type conv struct {
	turns []Turn
	seen  map[string]bool
	last  time.Time // last recorded, for forgetting
}

// NewMemory keeps the last perUser turns of at most users conversations.
func NewMemory(perUser, users int) *Memory {
	return &Memory{perUser: max(perUser, 1), users: max(users, 1), convs: map[string]*conv{}}
}

// Record adds m to its conversation (once per msgid).
func (mem *Memory) Record(m *chatmsg.ChatMessage) { mem.record(m) }

func (mem *Memory) record(m *chatmsg.ChatMessage) {
	mem.add(m.OpenKfID, m.ExternalUserID, m.UpstreamMsgID, Turn{MsgID: m.UpstreamMsgID, Origin: m.Origin,
		Servicer: m.ServicerUserID, MsgType: m.MsgType, SendTime: time.Unix(m.SendTime, 0).UTC(), Content: m.Content})
}

// add adds turn t, known as id, to the conversation of user on openKfID
// (once per id).
func (mem *Memory) add(openKfID, user, id string, t Turn) {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	k := openKfID + "\x00" + user
	c := mem.convs[k]
	if c == nil {
		if len(mem.convs) >= mem.users {
			mem.forgetOldestLocked()
		}
		c = &conv{seen: map[string]bool{}}
		mem.convs[k] = c
	}
	c.last = time.Now()
	if c.seen[id] {
		return
	}
	c.seen[id] = true
	t.id = id
	// In send order (a retried message may come back late).
	i := sort.Search(len(c.turns), func(i int) bool { return c.turns[i].SendTime.After(t.SendTime) })
	c.turns = append(c.turns, Turn{})
	copy(c.turns[i+1:], c.turns[i:])
	c.turns[i] = t
	if len(c.turns) > mem.perUser {
		for _, old := range c.turns[:len(c.turns)-mem.perUser] {
			delete(c.seen, old.id)
		}
		c.turns = append([]Turn(nil), c.turns[len(c.turns)-mem.perUser:]...)
	}
}

// Replies returns ctx in which the replies a handler makes for m (a
// batch's are keyed by its first message) are recorded as turns of m's
// conversation, right after m: the bot's replies are turns too.
func (mem *Memory) Replies(ctx context.Context, m *chatmsg.ChatMessage) context.Context {
	return outcome.WithSink(ctx, func(r outcome.Reply) { mem.recordReply(m, r) })
}

// recordReply adds the reply r to m's conversation when the customer got
// it (sent, or sent by an earlier run), right after m.
func (mem *Memory) recordReply(m *chatmsg.ChatMessage, r outcome.Reply) {
	if r.Outcome != "sent" && r.Outcome != "skipped" {
		return
	}
	mem.add(m.OpenKfID, m.ExternalUserID, m.UpstreamMsgID+"\x00reply:"+strconv.Itoa(r.N),
		Turn{MsgID: m.UpstreamMsgID, Origin: archive.OriginBot, MsgType: r.MsgType,
			SendTime: time.Unix(m.SendTime, 0).UTC(), Content: r.Content})
}

func (mem *Memory) forgetOldestLocked() {
	var oldest string
	var at time.Time
	for k, c := range mem.convs {
		if oldest == "" || c.last.Before(at) {
			oldest, at = k, c.last
		}
	}
	delete(mem.convs, oldest)
}

// Last implements Source.
func (mem *Memory) Last(_ context.Context, openKfID, user string, before time.Time, exclude string, n int) ([]Turn, error) {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	c := mem.convs[openKfID+"\x00"+user]
	if c == nil || n <= 0 {
		return []Turn{}, nil
	}
	out := make([]Turn, 0, n)
	for i := len(c.turns) - 1; i >= 0 && len(out) < n; i-- {
		t := c.turns[i]
		if t.MsgID == exclude || t.SendTime.After(before) {
			continue
		}
		out = append(out, t)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
