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
	TypeText     = "text"
	TypeImage    = "image"
	TypeVoice    = "voice"
	TypeVideo    = "video"
	TypeFile     = "file"
	TypeLocation = "location"
	TypeEvent    = "event"
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
	// HasLocation is true when a location message carries its
	// "location" object.
	HasLocation bool
	Location    Location
}

// Location is the "location" object of a location item: a place the
// customer shared.
type Location struct {
	Latitude  float64 `json:"latitude"`
	Longitude float64 `json:"longitude"`
	Name      string  `json:"name"`
	Address   string  `json:"address"`
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

// Shapes ParseBody decodes an item into: the msgtype and the object of
// that type only, in one pass, so a field of another type's object cannot
// make a message unreadable.
type (
	textItem struct {
		MsgType string `json:"msgtype"`
		Text    *struct {
			Content string `json:"content"`
			MenuID  string `json:"menu_id"`
		} `json:"text"`
	}
	mediaObject struct {
		MediaID string `json:"media_id"`
	}
	imageItem struct {
		MsgType string       `json:"msgtype"`
		Object  *mediaObject `json:"image"`
	}
	voiceItem struct {
		MsgType string       `json:"msgtype"`
		Object  *mediaObject `json:"voice"`
	}
	videoItem struct {
		MsgType string       `json:"msgtype"`
		Object  *mediaObject `json:"video"`
	}
	fileItem struct {
		MsgType string       `json:"msgtype"`
		Object  *mediaObject `json:"file"`
	}
	locationItem struct {
		MsgType  string    `json:"msgtype"`
		Location *Location `json:"location"`
	}
	eventItem struct {
		MsgType string `json:"msgtype"`
		Event   *Event `json:"event"`
	}
	otherItem struct {
		MsgType string `json:"msgtype"`
	}
)

// ParseBody reads the typed content of item (ChatMessage.Content) for a
// message of msgType. It fails (ErrMalformed) when item is not a JSON
// object, its msgtype is not msgType, or the object of msgType is not of
// WeChat's shape; a msgType without typed content has an empty Body.
func ParseBody(msgType string, item []byte) (Body, error) {
	if t := bytes.TrimSpace(item); len(t) == 0 || t[0] != '{' {
		return Body{}, fmt.Errorf("%w: item: not a JSON object", ErrMalformed)
	}
	var b Body
	var err error
	switch msgType {
	case TypeText:
		var j textItem
		if err = decodeItem(msgType, item, &j, &j.MsgType); err == nil && j.Text != nil {
			b.HasText, b.Text, b.MenuID = true, j.Text.Content, j.Text.MenuID
		}
	case TypeImage:
		var j imageItem
		err = decodeItem(msgType, item, &j, &j.MsgType)
		b.MediaID = j.Object.mediaID()
	case TypeVoice:
		var j voiceItem
		err = decodeItem(msgType, item, &j, &j.MsgType)
		b.MediaID = j.Object.mediaID()
	case TypeVideo:
		var j videoItem
		err = decodeItem(msgType, item, &j, &j.MsgType)
		b.MediaID = j.Object.mediaID()
	case TypeFile:
		var j fileItem
		err = decodeItem(msgType, item, &j, &j.MsgType)
		b.MediaID = j.Object.mediaID()
	case TypeLocation:
		var j locationItem
		if err = decodeItem(msgType, item, &j, &j.MsgType); err == nil && j.Location != nil {
			b.HasLocation, b.Location = true, *j.Location
		}
	case TypeEvent:
		var j eventItem
		if err = decodeItem(msgType, item, &j, &j.MsgType); err == nil && j.Event != nil {
			b.HasEvent, b.Event = true, *j.Event
		}
	default:
		var j otherItem
		err = decodeItem(msgType, item, &j, &j.MsgType)
	}
	if err != nil {
		return Body{}, err
	}
	return b, nil
}

// decodeItem decodes item into v, whose msgtype field is itemType, and
// checks that the item's msgtype (when it has one) is msgType.
func decodeItem(msgType string, item []byte, v any, itemType *string) error {
	if err := json.Unmarshal(item, v); err != nil {
		return fmt.Errorf("%w: item of msgtype %q: %v", ErrMalformed, msgType, err)
	}
	if *itemType != "" && msgType != "" && *itemType != msgType {
		return fmt.Errorf("%w: item's msgtype %q, message's %q", ErrMalformed, *itemType, msgType)
	}
	return nil
}

func (o *mediaObject) mediaID() string {
	if o == nil {
		return ""
	}
	return o.MediaID
}

// Body reads m's typed content (ParseBody of Content).
func (m *ChatMessage) Body() (Body, error) { return ParseBody(m.MsgType, m.Content) }
