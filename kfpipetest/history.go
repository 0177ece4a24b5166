package kfpipetest

import (
	"context"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/history"
)

// The conversation kfpipe.History serves in a test: every message Run or
// RunBatch gives the handler is remembered (as the consumer's archive
// would hold it), so is every reply the handler sent (OriginBot), and Remember adds earlier turns without running the
// handler — what the customer said yesterday, a human servicer's answer.

// historyTurns is how many turns of a conversation the harness keeps.
const historyTurns = 1000

// Remember adds msgs to their conversations' history without running the
// handler: kfpipe.History returns them to the handler of a later message
// (in send order; messages of the same second in the order remembered).
func (hs *Harness) Remember(msgs ...*kfpipe.Message) {
	for _, m := range msgs {
		hs.memory().Record(chatOf(m))
	}
}

// withHistory is ctx with the harness's history, msgs remembered.
func (hs *Harness) withHistory(ctx context.Context, msgs []*kfpipe.Message) context.Context {
	hs.Remember(msgs...)
	if len(msgs) > 0 {
		// The replies the handler sends are turns of the conversation.
		ctx = hs.memory().Replies(ctx, chatOf(msgs[0]))
	}
	return history.With(ctx, hs.memory())
}

func (hs *Harness) memory() *history.Memory {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.history == nil {
		hs.history = history.NewMemory(historyTurns, historyTurns)
	}
	return hs.history
}
