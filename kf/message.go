package kf

import (
	"encoding/json"
	"fmt"
)

// Message is a message to send: Text, Image, Voice, Video, File, Link,
// MiniProgram, Menu, Location or CALink.
type Message interface {
	msgType() string
	body() map[string]any
}

// Text is a text message.
type Text struct {
	Content string
}

// Image is an image uploaded to WeChat beforehand (its media_id).
type Image struct {
	MediaID string
}

// Link is a link card.
type Link struct {
	Title, Desc, URL string
	// ThumbMediaID is the card's picture (an uploaded image).
	ThumbMediaID string
}

// MiniProgram is a mini program card.
type MiniProgram struct {
	AppID, Title, PagePath string
	ThumbMediaID           string
}

// Location is a place.
type Location struct {
	Name, Address       string
	Latitude, Longitude float64
}

// Menu is a message with choices the customer taps (msgmenu): a click
// item comes back as a text message carrying its ID in the menu_id field.
type Menu struct {
	HeadContent string
	Items       []MenuItem
	TailContent string
}

// MenuItem is one choice of a Menu: a click (ID and Content), a link (URL
// and Content) or a mini program (AppID, PagePath and Content).
type MenuItem struct {
	ID, Content     string
	URL             string
	AppID, PagePath string
}

func (Text) msgType() string        { return "text" }
func (Image) msgType() string       { return "image" }
func (Link) msgType() string        { return "link" }
func (MiniProgram) msgType() string { return "miniprogram" }
func (Location) msgType() string    { return "location" }
func (Menu) msgType() string        { return "msgmenu" }

func (m Text) body() map[string]any {
	return map[string]any{"msgtype": "text", "text": map[string]any{"content": m.Content}}
}

func (m Image) body() map[string]any {
	return map[string]any{"msgtype": "image", "image": map[string]any{"media_id": m.MediaID}}
}

func (m Link) body() map[string]any {
	return map[string]any{"msgtype": "link", "link": map[string]any{"title": m.Title, "desc": m.Desc, "url": m.URL,
		"thumb_media_id": m.ThumbMediaID}}
}

func (m MiniProgram) body() map[string]any {
	return map[string]any{"msgtype": "miniprogram", "miniprogram": map[string]any{"appid": m.AppID, "title": m.Title,
		"thumb_media_id": m.ThumbMediaID, "pagepath": m.PagePath}}
}

func (m Location) body() map[string]any {
	return map[string]any{"msgtype": "location", "location": map[string]any{"name": m.Name, "address": m.Address,
		"latitude": m.Latitude, "longitude": m.Longitude}}
}

func (m Menu) body() map[string]any {
	items := make([]map[string]any, 0, len(m.Items))
	for _, it := range m.Items {
		switch {
		case it.URL != "":
			items = append(items, map[string]any{"type": "view", "view": map[string]any{"url": it.URL, "content": it.Content}})
		case it.AppID != "":
			items = append(items, map[string]any{"type": "miniprogram",
				"miniprogram": map[string]any{"appid": it.AppID, "pagepath": it.PagePath, "content": it.Content}})
		default:
			items = append(items, map[string]any{"type": "click", "click": map[string]any{"id": it.ID, "content": it.Content}})
		}
	}
	return map[string]any{"msgtype": "msgmenu", "msgmenu": map[string]any{"head_content": m.HeadContent, "list": items,
		"tail_content": m.TailContent}}
}

// ParseMessage reads a message in send_msg's own JSON shape, as a webhook
// receiver returns it ({"msgtype":"text","text":{"content":"…"}}; see
// docs/handler-protocol.md). Only the msgtype and its object are kept.
func ParseMessage(data []byte) (Message, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("kf: a message must be a JSON object: %w", err)
	}
	var typ string
	if err := json.Unmarshal(m["msgtype"], &typ); err != nil || typ == "" {
		return nil, fmt.Errorf("kf: message without a msgtype: %s", data)
	}
	switch typ {
	case "text", "image", "voice", "video", "file", "link", "miniprogram", "msgmenu", "location", "ca_link":
	default:
		return nil, fmt.Errorf("kf: msgtype %q cannot be sent (text, image, voice, video, file, link, miniprogram, msgmenu, location, ca_link)", typ)
	}
	var obj map[string]any
	if err := json.Unmarshal(m[typ], &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("kf: a %s message needs a %q object: %s", typ, typ, data)
	}
	switch typ {
	case "image", "voice", "video", "file":
		if id, _ := obj["media_id"].(string); id == "" {
			return nil, fmt.Errorf("kf: a %s message needs a media_id (UploadMedia): %s", typ, data)
		}
	case "ca_link":
		if u, _ := obj["link_url"].(string); u == "" {
			return nil, fmt.Errorf("kf: a ca_link message needs a link_url: %s", data)
		}
	}
	if c, ok := obj["content"].(string); typ == "text" && ok && len(obj) == 1 {
		// A Text, so kfpipe.Reply splits one over WeChat's limit.
		return Text{Content: c}, nil
	}
	return raw{typ: typ, obj: obj}, nil
}

// raw is a message ParseMessage read.
type raw struct {
	typ string
	obj map[string]any
}

func (r raw) msgType() string { return r.typ }
func (r raw) body() map[string]any {
	return map[string]any{"msgtype": r.typ, r.typ: r.obj}
}

// Item returns m as WeChat's message item, the JSON send_msg is given
// without its addressing ({"msgtype":"text","text":{"content":"…"}}), and
// its msgtype: how the conversation archive keeps a reply.
func Item(m Message) (msgType string, item json.RawMessage, err error) {
	if m == nil {
		return "", nil, fmt.Errorf("kf: no message")
	}
	b, err := json.Marshal(m.body())
	if err != nil {
		return "", nil, fmt.Errorf("kf: %w", err)
	}
	return m.msgType(), b, nil
}
