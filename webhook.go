package kfpipe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kfpipe/kfpipe/kf"
)

// webhookAnswer is what a receiver of the http handler may put in a 2xx
// answer (protocol 1, docs/handler-protocol.md): the replies to send, in
// order, and a change of the session's state after them.
type webhookAnswer struct {
	// Welcome is sent with the enter_session event's welcome_code.
	Welcome json.RawMessage `json:"welcome"`
	// Replies are messages in send_msg's shape.
	Replies  []json.RawMessage `json:"replies"`
	Transfer *struct {
		State    *int   `json:"service_state"`
		Servicer string `json:"servicer_userid"`
		// Message, when set, is sent with the transfer's msg_code
		// (SendEventMessage): text or msgmenu.
		Message json.RawMessage `json:"message"`
	} `json:"transfer"`
}

// webhookReplies sends the replies of a receiver's 2xx answer as the
// handler's replies (Welcome, Reply…, Transfer: the same numbering, so the
// same exactly-once rule as a Go handler's). An answer that is not a JSON
// object (an empty body, "ok") carries no replies; one that is and cannot
// be read is the receiver's bug: Permanent, with the reason.
func webhookReplies(ctx context.Context, body []byte) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil
	}
	var a webhookAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return Permanent(fmt.Errorf("webhook answer: %w", err))
	}
	if len(a.Welcome) == 0 && len(a.Replies) == 0 && a.Transfer == nil {
		return nil
	}
	// Read everything before sending anything: a bad last reply must not
	// leave the first ones sent and the message dead-lettered.
	var welcome kf.Message
	if len(a.Welcome) > 0 {
		m, err := kf.ParseMessage(a.Welcome)
		if err != nil {
			return Permanent(fmt.Errorf("webhook answer: welcome: %w", err))
		}
		welcome = m
	}
	replies := make([]kf.Message, len(a.Replies))
	for i, r := range a.Replies {
		m, err := kf.ParseMessage(r)
		if err != nil {
			return Permanent(fmt.Errorf("webhook answer: replies[%d]: %w", i, err))
		}
		replies[i] = m
	}
	if t := a.Transfer; t != nil && (t.State == nil || *t.State < int(kf.StateUntreated) || *t.State > int(kf.StateEnded)) {
		return Permanent(errors.New("webhook answer: transfer.service_state must be 0 to 4"))
	}
	var eventMsg kf.Message
	if t := a.Transfer; t != nil && len(t.Message) > 0 {
		m, err := kf.ParseMessage(t.Message)
		if err != nil {
			return Permanent(fmt.Errorf("webhook answer: transfer.message: %w", err))
		}
		eventMsg = m
	}
	if welcome != nil {
		if err := Welcome(ctx, welcome); err != nil {
			return err
		}
	}
	for _, m := range replies {
		if err := Reply(ctx, m); err != nil {
			return err
		}
	}
	if t := a.Transfer; t != nil {
		code, err := Transfer(ctx, kf.State(*t.State), t.Servicer)
		if err != nil || eventMsg == nil || code == "" {
			return err
		}
		return SendEventMessage(ctx, code, eventMsg)
	}
	return nil
}
