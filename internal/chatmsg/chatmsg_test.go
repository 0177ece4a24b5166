package chatmsg

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestDecode(t *testing.T) {
	ok := `{"message_id":"42","upstream_msgid":"m1","open_kfid":"kf1","external_userid":"u1","msg_type":"text","send_time":1,"content":{"text":{"content":"hi"}}}`
	cases := []struct {
		name string
		in   string
		err  error
	}{
		{"valid", ok, nil},
		{"not json", `{`, ErrMalformed},
		{"wrong type", `{"message_id":"x"}`, ErrMalformed},
		{"no msgid", `{"open_kfid":"kf1","external_userid":"u1"}`, ErrMissingField},
		{"no kfid", `{"upstream_msgid":"m","external_userid":"u1"}`, ErrMissingField},
		{"no user", `{"upstream_msgid":"m","open_kfid":"kf1"}`, ErrMissingField},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode([]byte(c.in))
			if !errors.Is(err, c.err) {
				t.Fatalf("Decode err = %v, want %v", err, c.err)
			}
			if c.err == nil && (m.MessageID != 42 || m.DedupKey() != "kf1:m1") {
				t.Fatalf("decoded %+v", m)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	in := &ChatMessage{MessageID: 7, UpstreamMsgID: "u", OpenKfID: "k", ExternalUserID: "e", MsgType: "text",
		SendTime: 3, ProducedAt: 4, Content: []byte(`{"a":1}`)}
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.MessageID != in.MessageID || string(out.Content) != string(in.Content) || out.ProducedAt != 4 {
		t.Fatalf("round trip: %+v", out)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"message_id":"1","upstream_msgid":"m","open_kfid":"k","external_userid":"u"}`))
	f.Add([]byte(`{"content":[1,2,3]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err == nil {
			if m.Validate() != nil {
				t.Fatalf("Decode accepted an invalid message: %+v", m)
			}
			again, err := Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(again); err != nil {
				t.Fatalf("re-decode of encoded message: %v", err)
			}
		}
	})
}

// TestDecodeFastTakesEncodedForm: what Encode writes (the only form
// kf-producer and the DLQ retries produce) decodes on the fast path, to the
// same message as encoding/json; other forms fall back.
func TestDecodeFastTakesEncodedForm(t *testing.T) {
	full := &ChatMessage{MessageID: -7, UpstreamMsgID: "msg-ü-1", OpenKfID: "wk1", ExternalUserID: "wm2", MsgType: "text",
		Origin: 3, ServicerUserID: "s", SendTime: 1700000000, ProducedAt: 1700000000123,
		Content: json.RawMessage(`{"text":{"content":"he said \"hi\"\n"},"list":[1,2.5,null,true,{"a":[]}]}`)}
	for _, m := range []*ChatMessage{full, {UpstreamMsgID: "m", OpenKfID: "k", ExternalUserID: "u"}} {
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		var fast ChatMessage
		if !decodeFast(b, &fast) {
			t.Fatalf("fast path refused Encode's output %s", b)
		}
		var slow ChatMessage
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast %+v\nencoding/json %+v", fast, slow)
		}
	}
	for _, in := range []string{
		`{"message_id":"01","upstream_msgid":"m","open_kfid":"k","external_userid":"u"}`,
		`{"upstream_msgid":"m\u0041","open_kfid":"k","external_userid":"u"}`,
		`{"Upstream_MsgID":"m","open_kfid":"k","external_userid":"u"}`,
		`{"upstream_msgid":"m","open_kfid":"k","external_userid":"u","send_time":1.0}`,
		`{"upstream_msgid":"m","open_kfid":"k","external_userid":"u","send_time":null}`,
		`{"upstream_msgid":"m","open_kfid":"k","external_userid":"u"} x`,
		"{\"upstream_msgid\":\"m\xff\",\"open_kfid\":\"k\",\"external_userid\":\"u\"}",
	} {
		if decodeFast([]byte(in), new(ChatMessage)) {
			t.Errorf("fast path took %s; it must leave it to encoding/json", in)
		}
	}
}

// FuzzDecodeFast: whenever the fast path accepts an input, encoding/json
// accepts it too and decodes the same message.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{
		`{"message_id":"42","upstream_msgid":"m1","open_kfid":"kf1","external_userid":"u1","msg_type":"text","send_time":1,"content":{"text":{"content":"hi"}}}`,
		`{"content":null,"origin":-0}`,
		`{"content":"a\"b","produced_at":9223372036854775807}`,
		`{"content":[1,{"x":"]"}] ,"msg_type":"t"}`,
		` { "origin" : 1 , "content" : 12 } `,
		`{"content":tru}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast ChatMessage
		if !decodeFast(b, &fast) {
			return
		}
		var slow ChatMessage
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatalf("fast path accepted %q, encoding/json: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", b, fast, slow)
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	m := &ChatMessage{MessageID: 123456789012345, UpstreamMsgID: "msgid-0123456789abcdef", OpenKfID: "wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw",
		ExternalUserID: "wmAJ2GCAAAme1XQRC-NI-q0_ZM9ukoAw", MsgType: "text", Origin: 3, SendTime: 1700000000, ProducedAt: 1700000000123,
		Content: json.RawMessage(`{"text":{"content":"你好，我想咨询一下订单的发货时间"},"menu_id":"101"}`)}
	v, err := Encode(m)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Decode(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m ChatMessage
			if err := json.Unmarshal(v, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
