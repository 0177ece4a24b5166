package wecom

import (
	"encoding/json"
	"errors"
)

// Message origins in sync_msg items.
const (
	OriginCustomer = 3 // sent by the WeChat user
	OriginEvent    = 4 // system event
	OriginServicer = 5 // sent by a servicer from the WeCom client
)

// Message is one item of sync_msg's msg_list. The typed fields are the ones
// every item has; Raw is the whole item exactly as received, so message
// types this code does not know are never lost on the way to Kafka.
type Message struct {
	MsgID          string
	OpenKfID       string
	ExternalUserID string
	SendTime       int64
	Origin         int
	ServicerUserID string
	MsgType        string
	Raw            json.RawMessage
}

// wireMessage is the JSON shape of an item; event items carry open_kfid and
// external_userid inside "event" instead of at the top.
type wireMessage struct {
	MsgID          string `json:"msgid"`
	OpenKfID       string `json:"open_kfid,omitempty"`
	ExternalUserID string `json:"external_userid,omitempty"`
	SendTime       int64  `json:"send_time"`
	Origin         int    `json:"origin"`
	ServicerUserID string `json:"servicer_userid,omitempty"`
	MsgType        string `json:"msgtype"`
	Event          *struct {
		OpenKfID       string `json:"open_kfid"`
		ExternalUserID string `json:"external_userid"`
	} `json:"event,omitempty"`
}

// UnmarshalJSON keeps the item in Raw and fills the typed fields, taking
// open_kfid and external_userid from "event" when the top level lacks them.
func (m *Message) UnmarshalJSON(b []byte) error {
	var w wireMessage
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*m = Message{
		MsgID: w.MsgID, OpenKfID: w.OpenKfID, ExternalUserID: w.ExternalUserID,
		SendTime: w.SendTime, Origin: w.Origin, ServicerUserID: w.ServicerUserID, MsgType: w.MsgType,
		Raw: append(json.RawMessage(nil), b...),
	}
	if w.Event != nil {
		if m.OpenKfID == "" {
			m.OpenKfID = w.Event.OpenKfID
		}
		if m.ExternalUserID == "" {
			m.ExternalUserID = w.Event.ExternalUserID
		}
	}
	return nil
}

// MarshalJSON returns Raw when set (the item as WeChat sent it), otherwise
// the typed fields in WeChat's shape.
func (m Message) MarshalJSON() ([]byte, error) {
	if len(m.Raw) > 0 {
		if !json.Valid(m.Raw) {
			return nil, errors.New("wecom: Message.Raw is not valid JSON")
		}
		return m.Raw, nil
	}
	return json.Marshal(wireMessage{
		MsgID: m.MsgID, OpenKfID: m.OpenKfID, ExternalUserID: m.ExternalUserID, SendTime: m.SendTime,
		Origin: m.Origin, ServicerUserID: m.ServicerUserID, MsgType: m.MsgType,
	})
}

// Text returns text.content of a text message.
func (m *Message) Text() (string, bool) {
	if m.MsgType != "text" {
		return "", false
	}
	var v struct {
		Text *struct {
			Content string `json:"content"`
		} `json:"text"`
	}
	if json.Unmarshal(m.Raw, &v) != nil || v.Text == nil {
		return "", false
	}
	return v.Text.Content, true
}

// MsgEvent is the event object of an msgtype "event" item.
type MsgEvent struct {
	EventType      string `json:"event_type"`
	OpenKfID       string `json:"open_kfid"`
	ExternalUserID string `json:"external_userid"`
}

// Event returns the event of an event item (enter_session, msg_send_fail…).
func (m *Message) Event() (MsgEvent, bool) {
	if m.MsgType != "event" {
		return MsgEvent{}, false
	}
	var v struct {
		Event *MsgEvent `json:"event"`
	}
	if json.Unmarshal(m.Raw, &v) != nil || v.Event == nil {
		return MsgEvent{}, false
	}
	return *v.Event, true
}
