package chatmsg

import (
	"errors"
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
