package chatmsg

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseItem(t *testing.T) {
	text := `{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"hi","menu_id":"101"}}`
	event := `{"msgid":"m2","send_time":1700000001,"origin":4,"msgtype":"event","event":{"event_type":"enter_session","open_kfid":"wk1","external_userid":"u2","welcome_code":"w"}}`
	unknown := `{"msgid":"m3","open_kfid":"wk1","external_userid":"u1","send_time":5,"origin":3,"msgtype":"channels_shop_product","channels_shop_product":{"product_id":"10000","nested":{"x":[1,2,3]}}}`
	servicer := `{"msgid":"m4","open_kfid":"wk1","external_userid":"u1","send_time":6,"origin":5,"servicer_userid":"alice","msgtype":"text","text":{"content":"Hi"}}`
	tests := []struct {
		name string
		in   string
		want ChatMessage // Content is checked to be in itself
		err  error
		key  string // the key an error names
	}{
		{"text", text, ChatMessage{UpstreamMsgID: "m1", OpenKfID: "wk1", ExternalUserID: "u1", SendTime: 1700000000, Origin: 3, MsgType: "text"}, nil, ""},
		{"event: ids inside event", event, ChatMessage{UpstreamMsgID: "m2", OpenKfID: "wk1", ExternalUserID: "u2", SendTime: 1700000001, Origin: 4, MsgType: "event"}, nil, ""},
		{"unknown type", unknown, ChatMessage{UpstreamMsgID: "m3", OpenKfID: "wk1", ExternalUserID: "u1", SendTime: 5, Origin: 3, MsgType: "channels_shop_product"}, nil, ""},
		{"servicer", servicer, ChatMessage{UpstreamMsgID: "m4", OpenKfID: "wk1", ExternalUserID: "u1", SendTime: 6, Origin: 5, ServicerUserID: "alice", MsgType: "text"}, nil, ""},
		{"surrounding space", "  " + text + "\n", ChatMessage{UpstreamMsgID: "m1", OpenKfID: "wk1", ExternalUserID: "u1", SendTime: 1700000000, Origin: 3, MsgType: "text"}, nil, ""},
		{"not json", `{"msgid":"m1",`, ChatMessage{}, ErrMalformed, ""},
		{"empty", ``, ChatMessage{}, ErrMalformed, ""},
		{"null", `null`, ChatMessage{}, ErrMalformed, ""},
		{"array", `[{"msgid":"m1"}]`, ChatMessage{}, ErrMalformed, ""},
		{"send_time a string", `{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","send_time":"1"}`, ChatMessage{}, ErrMalformed, ""},
		{"event not an object", `{"msgid":"m1","msgtype":"event","event":"enter_session"}`, ChatMessage{}, ErrMalformed, ""},
		{"no msgid", `{"open_kfid":"wk1","external_userid":"u1","msgtype":"text"}`, ChatMessage{}, ErrMissingField, "msgid"},
		{"no open_kfid", `{"msgid":"m1","external_userid":"u1","msgtype":"text"}`, ChatMessage{}, ErrMissingField, "open_kfid"},
		{"no external_userid", `{"msgid":"m1","open_kfid":"wk1","msgtype":"text"}`, ChatMessage{}, ErrMissingField, "external_userid"},
		// A servicer going on duty concerns no customer: it cannot be keyed.
		{"event without a customer", `{"msgid":"m5","origin":4,"msgtype":"event","event":{"event_type":"servicer_status_change","open_kfid":"wk1","servicer_userid":"alice","status":1}}`,
			ChatMessage{}, ErrMissingField, "external_userid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseItem([]byte(tt.in))
			if tt.err != nil {
				var ie *ItemError
				if !errors.Is(err, tt.err) || !errors.Is(err, ErrInvalidItem) || !errors.As(err, &ie) || m != nil {
					t.Fatalf("ParseItem(%s) = %+v, %v; want an *ItemError wrapping %v", tt.in, m, err, tt.err)
				}
				if string(ie.Item) != tt.in || !strings.Contains(err.Error(), tt.key) {
					t.Fatalf("error %q with item %s; want the item and the key %q", err, ie.Item, tt.key)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(m.Content) != strings.TrimSpace(tt.in) {
				t.Fatalf("Content = %s, want the item as received", m.Content)
			}
			got := *m
			got.Content = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseItem = %+v, want %+v", got, tt.want)
			}
			if err := m.Validate(); err != nil {
				t.Fatalf("a parsed item does not validate: %v", err)
			}
		})
	}
}

// TestParseItemOwnsContent: the item's buffer (a response body) may be
// reused after ParseItem.
func TestParseItemOwnsContent(t *testing.T) {
	buf := []byte(`{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","msgtype":"text","text":{"content":"hi"}}`)
	m, err := ParseItem(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := string(buf)
	for i := range buf {
		buf[i] = ' '
	}
	if string(m.Content) != want {
		t.Fatalf("Content shares the caller's buffer: %q", m.Content)
	}
}

func TestParseBody(t *testing.T) {
	tests := []struct {
		name, msgType, item string
		want                Body
		err                 bool
	}{
		{"text", "text", `{"msgtype":"text","text":{"content":"hi"}}`, Body{HasText: true, Text: "hi"}, false},
		{"menu click", "text", `{"msgtype":"text","text":{"content":"Shipping","menu_id":"101"}}`, Body{HasText: true, Text: "Shipping", MenuID: "101"}, false},
		{"empty text", "text", `{"msgtype":"text","text":{}}`, Body{HasText: true}, false},
		{"text without its object", "text", `{"msgtype":"text"}`, Body{}, false},
		{"text object of another shape", "text", `{"msgtype":"text","text":"hi"}`, Body{}, true},
		{"content not a string", "text", `{"msgtype":"text","text":{"content":5}}`, Body{}, true},
		{"broken json", "text", `{"msgtype":"text","text":{"content":"hi"}`, Body{}, true},
		{"not an object", "text", `"hi"`, Body{}, true},
		{"null", "text", `null`, Body{}, true},
		{"empty", "text", ``, Body{}, true},
		{"msgtype disagrees", "text", `{"msgtype":"image","image":{"media_id":"x"}}`, Body{}, true},
		{"image", "image", `{"msgtype":"image","image":{"media_id":"mi"}}`, Body{MediaID: "mi"}, false},
		{"voice", "voice", `{"msgtype":"voice","voice":{"media_id":"mv"}}`, Body{MediaID: "mv"}, false},
		{"video", "video", `{"msgtype":"video","video":{"media_id":"mo"}}`, Body{MediaID: "mo"}, false},
		{"file", "file", `{"msgtype":"file","file":{"media_id":"mf"}}`, Body{MediaID: "mf"}, false},
		{"location", "location", `{"msgtype":"location","location":{"latitude":23.1,"longitude":113.3,"name":"Canton Tower","address":"Guangzhou"}}`,
			Body{HasLocation: true, Location: Location{Latitude: 23.1, Longitude: 113.3, Name: "Canton Tower", Address: "Guangzhou"}}, false},
		{"location without its object", "location", `{"msgtype":"location"}`, Body{}, false},
		{"location of another shape", "location", `{"msgtype":"location","location":{"latitude":"23.1"}}`, Body{}, true},
		// Another type's object is not read.
		{"image beside an odd text field", "image", `{"msgtype":"image","image":{"media_id":"mi"},"text":5}`, Body{MediaID: "mi"}, false},
		{"enter_session", "event", `{"msgtype":"event","event":{"event_type":"enter_session","open_kfid":"wk1","external_userid":"u1","scene":"s","scene_param":"p","welcome_code":"w"}}`,
			Body{HasEvent: true, Event: Event{Type: "enter_session", OpenKfID: "wk1", ExternalUserID: "u1", Scene: "s", SceneParam: "p", WelcomeCode: "w"}}, false},
		{"session_status_change", "event", `{"msgtype":"event","event":{"event_type":"session_status_change","change_type":2,"old_servicer_userid":"a","new_servicer_userid":"b","msg_code":"c"}}`,
			Body{HasEvent: true, Event: Event{Type: "session_status_change", ChangeType: 2, OldServicerUserID: "a", NewServicerUserID: "b", MsgCode: "c"}}, false},
		{"msg_send_fail", "event", `{"msgtype":"event","event":{"event_type":"msg_send_fail","fail_msgid":"f","fail_type":4}}`,
			Body{HasEvent: true, Event: Event{Type: "msg_send_fail", FailMsgID: "f", FailType: 4}}, false},
		{"servicer_status_change", "event", `{"msgtype":"event","event":{"event_type":"servicer_status_change","servicer_userid":"alice","status":2}}`,
			Body{HasEvent: true, Event: Event{Type: "servicer_status_change", ServicerUserID: "alice", Status: 2}}, false},
		{"user_recall_msg", "event", `{"msgtype":"event","event":{"event_type":"user_recall_msg","recall_msgid":"r"}}`,
			Body{HasEvent: true, Event: Event{Type: "user_recall_msg", RecallMsgID: "r"}}, false},
		{"event field of another type", "event", `{"msgtype":"event","event":{"event_type":"msg_send_fail","fail_type":"4"}}`, Body{}, true},
		{"unknown type", "channels_shop_product", `{"msgtype":"channels_shop_product","channels_shop_product":{"x":1}}`, Body{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBody(tt.msgType, []byte(tt.item))
			if tt.err {
				if !errors.Is(err, ErrMalformed) || got != (Body{}) {
					t.Fatalf("ParseBody = %+v, %v; want ErrMalformed and no content", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseBody = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// FuzzParseItem: ParseItem never panics; what it accepts keys and routes
// (the three ids set), decodes on the consumer as it was encoded, and
// keeps the item whole; ParseBody never panics on it.
func FuzzParseItem(f *testing.F) {
	for _, s := range []string{
		`{"msgid":"m1","open_kfid":"wk1","external_userid":"u1","send_time":1,"origin":3,"msgtype":"text","text":{"content":"hi"}}`,
		`{"msgid":"m2","msgtype":"event","event":{"event_type":"enter_session","open_kfid":"wk1","external_userid":"u2"}}`,
		`{"msgid":"m3","open_kfid":"k","external_userid":"u","msgtype":"image","image":{"media_id":5}}`,
		`{"msgid":"","event":null}`,
		`[]`,
		`{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseItem(b)
		if err != nil {
			if m != nil || !errors.Is(err, ErrInvalidItem) {
				t.Fatalf("ParseItem(%q) = %+v, %v", b, m, err)
			}
			return
		}
		if m.Validate() != nil || !bytes.Equal(m.Content, bytes.TrimSpace(b)) || !json.Valid(m.Content) {
			t.Fatalf("ParseItem(%q) = %+v", b, m)
		}
		v, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(v)
		if err != nil || back.DedupKey() != m.DedupKey() || back.ExternalUserID != m.ExternalUserID {
			t.Fatalf("%q: round trip %+v, %v", b, back, err)
		}
		_, _ = m.Body()
	})
}

func BenchmarkParseItem(b *testing.B) {
	item := []byte(`{"msgid":"msgid-0123456789abcdef","open_kfid":"wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw","external_userid":"wmAJ2GCAAAme1XQRC-NI-q0_ZM9ukoAw","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"你好，我想咨询一下订单的发货时间","menu_id":"101"}}`)
	b.Run("ParseItem", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseItem(item); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ParseBody", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseBody(TypeText, item); err != nil {
				b.Fatal(err)
			}
		}
	})
}
