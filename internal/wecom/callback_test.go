package wecom

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseEnvelope(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Envelope
		wantErr bool
	}{
		{"wechat", "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[abc+/=]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>",
			Envelope{ToUserName: "wx5823bf96d3bd56c7", Encrypt: "abc+/=", AgentID: "218"}, false},
		{"no agent id, whitespace", "<xml>\n <ToUserName>ww1</ToUserName>\n <Encrypt>\n  abc \n</Encrypt>\n</xml>",
			Envelope{ToUserName: "ww1", Encrypt: "abc"}, false},
		{"no Encrypt", "<xml><ToUserName>x</ToUserName></xml>", Envelope{}, true},
		{"empty Encrypt", "<xml><Encrypt><![CDATA[]]></Encrypt></xml>", Envelope{}, true},
		{"other root", "<root><Encrypt>abc</Encrypt></root>", Envelope{}, true},
		{"json", `{"Encrypt":"abc"}`, Envelope{}, true},
		{"empty", "", Envelope{}, true},
		{"truncated", "<xml><Encrypt>abc", Envelope{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnvelope([]byte(tt.body))
			if tt.wantErr {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("err = %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Fatalf("got %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestParseEvent(t *testing.T) {
	kf := Event{ToUserName: "ww1", CreateTime: 1348831860, MsgType: "event", Event: EventKFMsgOrEvent,
		Token: "ENCApHxnGDNAVNY4AaSJKj4Tb5mwsEMzxhFmHVGcra996NR", OpenKfID: "wkxxxxxxx"}
	tests := []struct {
		name    string
		body    string
		want    Event
		wantErr bool
	}{
		{"kf_msg_or_event (docs)", `<xml>
   <ToUserName><![CDATA[ww1]]></ToUserName>
   <CreateTime>1348831860</CreateTime>
   <MsgType><![CDATA[event]]></MsgType>
   <Event><![CDATA[kf_msg_or_event]]></Event>
   <Token><![CDATA[ENCApHxnGDNAVNY4AaSJKj4Tb5mwsEMzxhFmHVGcra996NR]]></Token>
   <OpenKfId><![CDATA[wkxxxxxxx]]></OpenKfId>
</xml>`, kf, false},
		{"round trip of MarshalEventXML", string(MarshalEventXML(&kf)), kf, false},
		{"other event is parsed, not KF", "<xml><MsgType>event</MsgType><Event>change_contact</Event></xml>",
			Event{MsgType: "event", Event: "change_contact"}, false},
		{"kf_account_auth_change", `<xml><ToUserName><![CDATA[ww1]]></ToUserName><CreateTime>1</CreateTime>
   <MsgType><![CDATA[event]]></MsgType><Event><![CDATA[kf_account_auth_change]]></Event>
   <AuthAddOpenKfId><![CDATA[wkA]]></AuthAddOpenKfId><AuthAddOpenKfId><![CDATA[wkB]]></AuthAddOpenKfId>
   <AuthDelOpenKfId><![CDATA[wkC]]></AuthDelOpenKfId></xml>`,
			Event{ToUserName: "ww1", CreateTime: 1, MsgType: "event", Event: EventKFAccountAuthChange,
				AuthAdd: []string{"wkA", "wkB"}, AuthDel: []string{"wkC"}}, false},
		{"kf event without OpenKfId", "<xml><MsgType>event</MsgType><Event>kf_msg_or_event</Event><Token>t</Token></xml>", Event{}, true},
		{"no MsgType", "<xml><Event>kf_msg_or_event</Event></xml>", Event{}, true},
		{"bad CreateTime", "<xml><CreateTime>soon</CreateTime><MsgType>event</MsgType></xml>", Event{}, true},
		{"not xml", "hello", Event{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEvent([]byte(tt.body))
			if tt.wantErr {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("err = %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Fatalf("got %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestMarshalXMLEscapesCDATA(t *testing.T) {
	e := Event{MsgType: "event", Event: EventKFMsgOrEvent, Token: "a]]>b<c", OpenKfID: "wk]]>"}
	got, err := ParseEvent(MarshalEventXML(&e))
	if err != nil {
		t.Fatal(err)
	}
	if got.Token != e.Token || got.OpenKfID != e.OpenKfID {
		t.Fatalf("got %+v", got)
	}
	env, err := ParseEnvelope(MarshalEnvelopeXML(&Envelope{ToUserName: "x]]>", Encrypt: "abc"}))
	if err != nil || env.ToUserName != "x]]>" {
		t.Fatalf("envelope %+v, %v", env, err)
	}
}

// FuzzCallback feeds arbitrary bodies and echostrs through what the handler
// does after the signature check: envelope parse, decrypt, event parse. None
// may panic, and whatever decrypts must have been encrypted for our receive
// ID (checked by re-encrypting and decrypting).
func FuzzCallback(f *testing.F) {
	c := vecCrypto(f)
	kf, _ := c.Encrypt(MarshalEventXML(&Event{MsgType: "event", Event: EventKFMsgOrEvent, Token: "t", OpenKfID: "wk1"}))
	f.Add([]byte("<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA["+vecPostEnc+"]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>"), vecEchoStr)
	f.Add([]byte("<xml><Encrypt>"+kf+"</Encrypt></xml>"), kf)
	f.Add([]byte("<xml><Encrypt></Encrypt></xml>"), "")
	f.Add([]byte("<xml><Encrypt>AAAA</Encrypt>"), "AAAAAAAAAAAAAAAAAAAAAA==")
	f.Add([]byte("\x00\xff<xml"), "%%%")
	f.Fuzz(func(t *testing.T, body []byte, echostr string) {
		if msg, err := c.Decrypt(echostr); err == nil {
			enc, err := c.Encrypt(msg)
			if err != nil {
				t.Fatal(err)
			}
			again, err := c.Decrypt(enc)
			if err != nil || string(again) != string(msg) {
				t.Fatalf("re-encryption round trip failed: %v", err)
			}
		}
		env, err := ParseEnvelope(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseEnvelope error not ErrMalformed: %v", err)
			}
			return
		}
		plain, err := c.Decrypt(env.Encrypt)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrBadPadding) && !errors.Is(err, ErrReceiveIDMismatch) {
				t.Fatalf("Decrypt error not a sentinel: %v", err)
			}
			return
		}
		ev, err := ParseEvent(plain)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseEvent error not ErrMalformed: %v", err)
			}
			return
		}
		if ev.IsKFMsgOrEvent() && ev.OpenKfID == "" {
			t.Fatal("kf_msg_or_event accepted without OpenKfId")
		}
	})
}
