package chatmsg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// This file is the one reader of WeChat's sync_msg item JSON: ParseItem
// reads what the producer needs to key and route an item, ParseBody the
// typed content a handler reads. Both read the item as WeChat sent it,
// which ChatMessage.Content keeps whole.

// ErrInvalidItem is wrapped by every ParseItem error.
var ErrInvalidItem = errors.New("chatmsg: invalid sync_msg item")

// ItemError is a sync_msg item ParseItem refused: the item as received and
// why. The producer counts and logs it and does not produce it.
type ItemError struct {
	// Item is the item exactly as WeChat sent it.
	Item json.RawMessage
	// Err wraps ErrInvalidItem and ErrMalformed or ErrMissingField.
	Err error
}

func (e *ItemError) Error() string { return e.Err.Error() }
func (e *ItemError) Unwrap() error { return e.Err }

// envelope is what every item carries; event items carry open_kfid and
// external_userid inside "event" instead of at the top.
type envelope struct {
	MsgID          string `json:"msgid"`
	OpenKfID       string `json:"open_kfid"`
	ExternalUserID string `json:"external_userid"`
	SendTime       int64  `json:"send_time"`
	Origin         int    `json:"origin"`
	ServicerUserID string `json:"servicer_userid"`
	MsgType        string `json:"msgtype"`
	Event          *struct {
		OpenKfID       string `json:"open_kfid"`
		ExternalUserID string `json:"external_userid"`
	} `json:"event"`
}

// ParseItem reads one item of sync_msg's msg_list into the record that
// goes to Kafka. Content is the item itself, byte for byte, so a message
// type this code does not know is never lost; MessageID and ProducedAt are
// left to the producer. An item that is not a JSON object of WeChat's
// shape (ErrMalformed) or lacks msgid, open_kfid or external_userid, at
// the top or, for an event, inside "event" (ErrMissingField), is an
// *ItemError.
func ParseItem(item []byte) (*ChatMessage, error) {
	fail := func(kind error, detail string) error {
		return &ItemError{Item: append(json.RawMessage(nil), item...), Err: fmt.Errorf("%w: %w: %s", ErrInvalidItem, kind, detail)}
	}
	var e envelope
	trimmed := bytes.TrimSpace(item)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fail(ErrMalformed, "not a JSON object")
	}
	if err := json.Unmarshal(trimmed, &e); err != nil {
		return nil, fail(ErrMalformed, err.Error())
	}
	if e.Event != nil {
		if e.OpenKfID == "" {
			e.OpenKfID = e.Event.OpenKfID
		}
		if e.ExternalUserID == "" {
			e.ExternalUserID = e.Event.ExternalUserID
		}
	}
	switch {
	case e.MsgID == "":
		return nil, fail(ErrMissingField, "msgid")
	case e.OpenKfID == "":
		return nil, fail(ErrMissingField, "open_kfid")
	case e.ExternalUserID == "":
		return nil, fail(ErrMissingField, "external_userid")
	}
	return &ChatMessage{UpstreamMsgID: e.MsgID, OpenKfID: e.OpenKfID, ExternalUserID: e.ExternalUserID,
		MsgType: e.MsgType, Origin: e.Origin, ServicerUserID: e.ServicerUserID, SendTime: e.SendTime,
		Content: append(json.RawMessage(nil), trimmed...)}, nil
}

// Message types whose content Body reads (WeChat's msgtype).
const (
	TypeText  = "text"
	TypeImage = "image"
	TypeVoice = "voice"
	TypeVideo = "video"
	TypeFile  = "file"
	TypeEvent = "event"
)

// Body is the typed content of an item: what a handler reads without
// parsing the item itself. Fields that do not belong to the item's
// msgtype are zero.
type Body struct {
	// HasText is true when a text message carries its "text" object;
	// Text is its content and MenuID the menu item the customer tapped.
	HasText bool
	Text    string
	MenuID  string
	// MediaID is an image's, voice note's, video's or file's media_id.
	MediaID string
	// HasEvent is true when an event message carries its "event" object.
	HasEvent bool
	Event    Event
}

// Event is the "event" object of an event item (msgtype event). The field
// list is kfpipe.Event's, which converts from it.
type Event struct {
	Type              string `json:"event_type"`
	OpenKfID          string `json:"open_kfid"`
	ExternalUserID    string `json:"external_userid"`
	ServicerUserID    string `json:"servicer_userid"`
	WelcomeCode       string `json:"welcome_code"`
	Scene             string `json:"scene"`
	SceneParam        string `json:"scene_param"`
	ChangeType        int    `json:"change_type"`
	OldServicerUserID string `json:"old_servicer_userid"`
	NewServicerUserID string `json:"new_servicer_userid"`
	MsgCode           string `json:"msg_code"`
	FailMsgID         string `json:"fail_msgid"`
	FailType          int    `json:"fail_type"`
	Status            int    `json:"status"`
	RecallMsgID       string `json:"recall_msgid"`
}

// bodyJSON is the part of an item Body reads; only the object of the
// item's msgtype is decoded, so a field of another type's object cannot
// make a message unreadable.
type bodyJSON struct {
	MsgType string          `json:"msgtype"`
	Text    json.RawMessage `json:"text"`
	Image   json.RawMessage `json:"image"`
	Voice   json.RawMessage `json:"voice"`
	Video   json.RawMessage `json:"video"`
	File    json.RawMessage `json:"file"`
	Event   json.RawMessage `json:"event"`
}

// ParseBody reads the typed content of item (ChatMessage.Content) for a
// message of msgType. It fails (ErrMalformed) when item is not a JSON
// object or the object of msgType is not of WeChat's shape; an unknown
// msgType has no typed content and an empty Body.
func ParseBody(msgType string, item []byte) (Body, error) {
	var b Body
	var j bodyJSON
	if t := bytes.TrimSpace(item); len(t) == 0 || t[0] != '{' {
		return b, fmt.Errorf("%w: item: not a JSON object", ErrMalformed)
	}
	if err := json.Unmarshal(item, &j); err != nil {
		return b, fmt.Errorf("%w: item: %v", ErrMalformed, err)
	}
	if j.MsgType != "" && msgType != "" && j.MsgType != msgType {
		return b, fmt.Errorf("%w: item's msgtype %q, message's %q", ErrMalformed, j.MsgType, msgType)
	}
	obj := func(raw json.RawMessage, v any) (bool, error) {
		if len(raw) == 0 || string(raw) == "null" {
			return false, nil
		}
		if err := json.Unmarshal(raw, v); err != nil {
			return false, fmt.Errorf("%w: %s: %v", ErrMalformed, msgType, err)
		}
		return true, nil
	}
	var err error
	switch msgType {
	case TypeText:
		var t struct {
			Content string `json:"content"`
			MenuID  string `json:"menu_id"`
		}
		b.HasText, err = obj(j.Text, &t)
		b.Text, b.MenuID = t.Content, t.MenuID
	case TypeImage, TypeVoice, TypeVideo, TypeFile:
		raw := j.Image
		switch msgType {
		case TypeVoice:
			raw = j.Voice
		case TypeVideo:
			raw = j.Video
		case TypeFile:
			raw = j.File
		}
		var m struct {
			MediaID string `json:"media_id"`
		}
		_, err = obj(raw, &m)
		b.MediaID = m.MediaID
	case TypeEvent:
		b.HasEvent, err = obj(j.Event, &b.Event)
	}
	if err != nil {
		return Body{}, err
	}
	return b, nil
}

// Body reads m's typed content (ParseBody of Content).
func (m *ChatMessage) Body() (Body, error) { return ParseBody(m.MsgType, m.Content) }
