package kfpipe

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// item reads a sync_msg item as the producer does and makes the handler's
// view of its record, as the consumer does.
func item(t *testing.T, raw string) *Message {
	t.Helper()
	c, err := chatmsg.ParseItem([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	c.MessageID = 7
	return fromChat(c)
}

func TestMessageFromRecord(t *testing.T) {
	m := item(t, `{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"Shipping","menu_id":"101"}}`)
	if m.ID != 7 || m.UpstreamMsgID != "m1" || m.OpenKfID != "wk1" || m.ExternalUserID != "u1" || m.MsgType != MsgText ||
		!m.FromCustomer() || !m.SendTime.Equal(time.Unix(1700000000, 0)) || m.IdempotencyKey() != "wk1:m1" {
		t.Fatalf("message = %+v", m)
	}
	if text, ok := m.Text(); !ok || text != "Shipping" || m.MenuID() != "101" {
		t.Fatalf("Text = %q, %v; MenuID %q", text, ok, m.MenuID())
	}
	if _, ok := m.Event(); ok {
		t.Fatal("Event of a text message")
	}
	if _, ok := m.Media(); ok {
		t.Fatal("Media of a text message")
	}
	// Read once, by the first accessor above: later calls parse nothing.
	if n := testing.AllocsPerRun(100, func() { _, _ = m.Text(); _ = m.MenuID(); _, _ = m.Event() }); n != 0 {
		t.Fatalf("the accessors allocate %v times a call: they parse Raw again", n)
	}

	ev := item(t, `{"msgid":"m2","send_time":1700000001,"origin":4,"msgtype":"event","event":{"event_type":"session_status_change","open_kfid":"wk1","external_userid":"u1","change_type":2,"old_servicer_userid":"alice","new_servicer_userid":"bob","msg_code":"c1"}}`)
	e, ok := ev.Event()
	want := Event{Type: EventSessionStatusChange, OpenKfID: "wk1", ExternalUserID: "u1", ChangeType: 2,
		OldServicerUserID: "alice", NewServicerUserID: "bob", MsgCode: "c1"}
	if !ok || e != want || !ev.IsEvent() || ev.ExternalUserID != "u1" {
		t.Fatalf("Event = %+v, %v; want %+v", e, ok, want)
	}
	if _, ok := ev.Text(); ok {
		t.Fatal("Text of an event")
	}

	img := item(t, `{"msgid":"m3","open_kfid":"wk1","external_userid":"u1","origin":3,"msgtype":"image","image":{"media_id":"mi"}}`)
	if ref, ok := img.Media(); !ok || ref != (MediaRef{Type: MsgImage, MediaID: "mi"}) {
		t.Fatalf("Media = %+v, %v", ref, ok)
	}

	loc := item(t, `{"msgid":"m5","open_kfid":"wk1","external_userid":"u1","origin":3,"msgtype":"location","location":{"latitude":23.1,"longitude":113.3,"name":"Canton Tower","address":"Guangzhou"}}`)
	if l, ok := loc.Location(); !ok || l != (Location{Latitude: 23.1, Longitude: 113.3, Name: "Canton Tower", Address: "Guangzhou"}) {
		t.Fatalf("Location = %+v, %v", l, ok)
	}
	if _, ok := m.Location(); ok {
		t.Fatal("Location of a text message")
	}

	// A type kfpipe does not know reaches the handler whole in Raw.
	const unknown = `{"msgid":"m4","open_kfid":"wk1","external_userid":"u1","origin":3,"msgtype":"channels_shop_product","channels_shop_product":{"product_id":"10000"}}`
	u := item(t, unknown)
	if string(u.Raw) != unknown || u.MsgType != "channels_shop_product" {
		t.Fatalf("unknown type = %+v", u)
	}
	if _, ok := u.Text(); ok {
		t.Fatal("Text of an unknown type")
	}
}

// TestMessageBrokenContent: content kfpipe cannot read is ok false, never
// ok with an empty value; a Message built by hand is read the same way.
func TestMessageBrokenContent(t *testing.T) {
	for _, tt := range []struct{ name, msgType, raw string }{
		{"not json", MsgText, `{"msgtype":"text","text":{"content":"hi"}`},
		{"not an object", MsgText, `"hi"`},
		{"no raw", MsgText, ``},
		{"no text object", MsgText, `{"msgtype":"text"}`},
		{"text of another shape", MsgText, `{"msgtype":"text","text":"hi"}`},
		{"msgtype disagrees", MsgText, `{"msgtype":"image","image":{"media_id":"m"}}`},
		{"event of another shape", MsgEvent, `{"msgtype":"event","event":{"event_type":"msg_send_fail","fail_type":"x"}}`},
		{"no event object", MsgEvent, `{"msgtype":"event"}`},
		{"image of another shape", MsgImage, `{"msgtype":"image","image":[1]}`},
		{"location of another shape", MsgLocation, `{"msgtype":"location","location":{"latitude":"north"}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			byHand := &Message{MsgType: tt.msgType, Raw: json.RawMessage(tt.raw)}
			fromRecord := fromChat(&chatmsg.ChatMessage{MsgType: tt.msgType, Content: json.RawMessage(tt.raw)})
			for _, m := range []*Message{byHand, fromRecord} {
				if text, ok := m.Text(); ok || text != "" {
					t.Errorf("Text = %q, %v", text, ok)
				}
				if e, ok := m.Event(); ok || e != (Event{}) {
					t.Errorf("Event = %+v, %v", e, ok)
				}
				if ref, ok := m.Media(); ok {
					t.Errorf("Media = %+v", ref)
				}
				if l, ok := m.Location(); ok || l != (Location{}) {
					t.Errorf("Location = %+v, %v", l, ok)
				}
				if id := m.MenuID(); id != "" {
					t.Errorf("MenuID = %q", id)
				}
			}
		})
	}
}

// TestMessageByHand: a Message a test builds, or one whose Raw a
// middleware replaced, answers for its own Raw.
func TestMessageByHand(t *testing.T) {
	m := &Message{MsgType: MsgText, Raw: json.RawMessage(`{"msgtype":"text","text":{"content":"hi","menu_id":"1"}}`)}
	if text, ok := m.Text(); !ok || text != "hi" || m.MenuID() != "1" {
		t.Fatalf("Text = %q, %v", text, ok)
	}
	r := item(t, `{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","msgtype":"text","text":{"content":"before"}}`)
	r.Raw = json.RawMessage(`{"msgid":"m1","msgtype":"text","text":{"content":"after"}}`)
	if text, ok := r.Text(); !ok || text != "after" {
		t.Fatalf("Text after Raw changed = %q, %v", text, ok)
	}
	r.MsgType = MsgEvent
	if _, ok := r.Event(); ok {
		t.Fatal("Event of a text item relabelled as an event")
	}
}
