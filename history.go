package kfpipe

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/history"
)

// Turn is one turn of a customer's conversation before the message being
// handled (History): the customer's message, a human servicer's or a
// system event, as WeChat delivered it, or a reply the bot sent
// (OriginBot).
type Turn struct {
	// MsgID is the message's upstream msgid; a reply's is the msgid of
	// the message it answered.
	MsgID string
	// Origin is who wrote it: OriginCustomer, OriginSystem,
	// OriginServicer or OriginBot.
	Origin int
	// Servicer is the servicer who wrote it (OriginServicer).
	Servicer string
	MsgType  string
	SendTime time.Time
	// Raw is WeChat's message item as received (JSON).
	Raw json.RawMessage
}

// Text returns a text turn's content.
func (t Turn) Text() (string, bool) {
	if t.MsgType != MsgText {
		return "", false
	}
	var item struct {
		Text struct {
			Content string `json:"content"`
		} `json:"text"`
	}
	if json.Unmarshal(t.Raw, &item) != nil {
		return "", false
	}
	return item.Text.Content, true
}

// ErrNoHistory is History's error when no conversation history is
// configured: archive.dsn is empty (and the handler does not run in
// kfpipetest, the simulator or the demo, which keep it in memory).
var ErrNoHistory = history.ErrNone

// History returns the last n turns of m's conversation (its customer on
// its KF account) sent before m, oldest first: the customer's messages,
// the human servicers', the events and the bot's own replies the
// customer got — the context an LLM-backed bot answers with. m itself is left out, and so is anything sent after it,
// so a retry (a DLQ retry days later included) sees the same history as
// the first attempt did, as far as the archive still keeps it.
//
// It reads the conversation archive (archive.dsn; the dlq-consumer's
// archiver fills it from the main topic, so the newest turns may lag it
// by the archiver's batch interval). The bot's replies do not come back
// through WeChat's sync_msg: the consumers record them on the outcomes
// topic (archive.outcomes_topic), which the archiver reads too. An error other
// than ErrNoHistory (the database unreachable) is worth returning: the
// message is retried.
func History(ctx context.Context, m *Message, n int) ([]Turn, error) {
	src := history.From(ctx)
	if src == nil {
		return nil, ErrNoHistory
	}
	if n <= 0 {
		return []Turn{}, nil
	}
	ts, err := src.Last(ctx, m.OpenKfID, m.ExternalUserID, m.SendTime, m.UpstreamMsgID, n)
	if err != nil {
		return nil, err
	}
	out := make([]Turn, len(ts))
	for i, t := range ts {
		out[i] = Turn{MsgID: t.MsgID, Origin: t.Origin, Servicer: t.Servicer, MsgType: t.MsgType, SendTime: t.SendTime, Raw: t.Content}
	}
	return out, nil
}

// WithMemoryHistory serves History from memory instead of the archive:
// the consumer remembers the last perUser turns of each conversation it
// sees. For a single process with no database (the simulator, a demo);
// a fleet of consumers needs the archive.
func WithMemoryHistory(perUser int) ConsumerOption {
	return func(c *Consumer) { c.memory = history.NewMemory(perUser, 100_000) }
}

// withHistory wraps ch so that History finds its source: mem when given,
// else the archive when archive.dsn is set; the returned func closes it.
func withHistory(ctx context.Context, cfg *config.Consumer, ch handler.Handler, mem *history.Memory) (handler.Handler, func(), error) {
	if mem != nil {
		return history.Wrap(ch, mem), func() {}, nil
	}
	if cfg.Archive.DSN == "" {
		return ch, func() {}, nil
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := archive.Open(octx, cfg.Archive.DSN, cfg.Archive.Retention)
	if err != nil {
		return nil, func() {}, fmt.Errorf("archive.dsn: %w", err)
	}
	return history.Wrap(ch, history.Archive(s)), s.Close, nil
}
