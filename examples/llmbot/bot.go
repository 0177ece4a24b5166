package main

import (
	"context"
	"errors"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// systemPrompt sets the model's part.
const systemPrompt = "You are the customer-service assistant of an online shop, answering customers on WeChat. " +
	"Answer briefly, in the customer's language. Messages marked [servicer NAME] were written by a human " +
	"colleague: stay consistent with what they said."

// notText answers a customer's photo, voice message or file: the model
// gets text only.
const notText = "Thanks! I can only read text here; please describe it in a few words, or type \"human\" for a colleague."

// Completer asks a chat model for its answer (Client; a fake in tests).
type Completer interface {
	Complete(ctx context.Context, msgs []ChatMessage) (string, error)
}

// Bot answers each customer text message with the model, given the
// customer's last turns of conversation (at most turns of them).
func Bot(model Completer, turns int) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() || m.MsgType == kfpipe.MsgEvent {
			return nil // a servicer's message, a system event: nothing to say
		}
		state, _, err := kfpipe.SessionState(ctx)
		if err != nil {
			return err
		}
		if state == kf.StateServicer || state == kf.StateQueue {
			return nil // a human serves (or will): the bot stays out
		}
		text, ok := m.Text()
		if !ok {
			return kfpipe.Reply(ctx, kf.Text{Content: notText})
		}
		// The model's answer is kept with the message: a second run of
		// the handler (the reply failed, the consumer crashed, the DLQ
		// retries it) sends the same words without asking the model
		// again — a new answer would differ, and cost a second call.
		answer, err := kfpipe.Memo(ctx, "llm-answer", func(ctx context.Context) (string, error) {
			msgs, err := prompt(ctx, m, text, turns)
			if err != nil {
				return "", err
			}
			return model.Complete(ctx, msgs)
		})
		if err != nil {
			return err
		}
		return kfpipe.Reply(ctx, kf.Text{Content: answer})
	})
}

// prompt is the request's messages: the system prompt, the customer's
// earlier turns (the customer's as user, the bot's own replies as
// assistant, a human servicer's as assistant marked with the servicer's
// name), then the message being answered.
// Without a conversation archive (kfpipe.ErrNoHistory) the model gets the
// message alone; the archive unreachable is an error (retried).
func prompt(ctx context.Context, m *kfpipe.Message, text string, turns int) ([]ChatMessage, error) {
	msgs := []ChatMessage{{Role: "system", Content: systemPrompt}}
	history, err := kfpipe.History(ctx, m, turns)
	if err != nil && !errors.Is(err, kfpipe.ErrNoHistory) {
		return nil, err
	}
	for _, t := range history {
		said, ok := t.Text()
		if !ok {
			said = "[" + t.MsgType + "]"
		}
		switch t.Origin {
		case kfpipe.OriginCustomer:
			msgs = append(msgs, ChatMessage{Role: "user", Content: said})
		case kfpipe.OriginServicer:
			msgs = append(msgs, ChatMessage{Role: "assistant", Content: "[servicer " + t.Servicer + "] " + said})
		case kfpipe.OriginBot:
			msgs = append(msgs, ChatMessage{Role: "assistant", Content: said})
		}
	}
	return append(msgs, ChatMessage{Role: "user", Content: text}), nil
}
