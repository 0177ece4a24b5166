package wecom

import (
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"
)

// EventKFMsgOrEvent is the callback event that tells us an open_kfid has new
// messages or events to pull with sync_msg.
const EventKFMsgOrEvent = "kf_msg_or_event"

// EventKFAccountAuthChange is the callback event that tells us the corp's
// customer-service accounts changed: AuthAddOpenKfId lists accounts the
// app may now use, AuthDelOpenKfId accounts it no longer may.
const EventKFAccountAuthChange = "kf_account_auth_change"

// Envelope is the outer XML of a callback POST:
// <xml><ToUserName/><Encrypt/><AgentID/></xml>.
type Envelope struct {
	ToUserName string
	Encrypt    string
	AgentID    string
}

type xmlEnvelope struct {
	XMLName    xml.Name `xml:"xml"`
	ToUserName string   `xml:"ToUserName"`
	Encrypt    string   `xml:"Encrypt"`
	AgentID    string   `xml:"AgentID"`
}

// ParseEnvelope parses a callback POST body. It returns an error wrapping
// ErrMalformed when the body is not the envelope or has no Encrypt.
func ParseEnvelope(body []byte) (*Envelope, error) {
	var x xmlEnvelope
	if err := xml.Unmarshal(body, &x); err != nil {
		return nil, fmt.Errorf("%w: envelope: %v", ErrMalformed, err)
	}
	enc := strings.TrimSpace(x.Encrypt)
	if enc == "" {
		return nil, fmt.Errorf("%w: envelope has no Encrypt", ErrMalformed)
	}
	return &Envelope{ToUserName: strings.TrimSpace(x.ToUserName), Encrypt: enc, AgentID: strings.TrimSpace(x.AgentID)}, nil
}

// Event is a decrypted callback message. For KF, MsgType is "event",
// Event is EventKFMsgOrEvent, and Token is the short-lived token to pass to
// sync_msg for OpenKfID.
type Event struct {
	ToUserName string
	CreateTime int64
	MsgType    string
	Event      string
	Token      string
	OpenKfID   string
	// AuthAdd and AuthDel are a kf_account_auth_change's accounts added
	// and removed.
	AuthAdd, AuthDel []string
}

// IsAccountAuthChange reports whether the event says the accounts changed.
func (e *Event) IsAccountAuthChange() bool {
	return e.MsgType == "event" && e.Event == EventKFAccountAuthChange
}

type xmlEvent struct {
	XMLName    xml.Name `xml:"xml"`
	ToUserName string   `xml:"ToUserName"`
	CreateTime string   `xml:"CreateTime"`
	MsgType    string   `xml:"MsgType"`
	Event      string   `xml:"Event"`
	Token      string   `xml:"Token"`
	OpenKfID   string   `xml:"OpenKfId"`
	AuthAdd    []string `xml:"AuthAddOpenKfId"`
	AuthDel    []string `xml:"AuthDelOpenKfId"`
}

// IsKFMsgOrEvent reports whether the event asks us to sync an open_kfid.
func (e *Event) IsKFMsgOrEvent() bool {
	return e.MsgType == "event" && e.Event == EventKFMsgOrEvent
}

// ParseEvent parses a decrypted callback message. Errors wrap ErrMalformed:
// not XML, no MsgType, a non-numeric CreateTime, or a kf_msg_or_event
// without OpenKfId (nothing could be synced from it). Other events parse
// without error so the caller can acknowledge and ignore them.
func ParseEvent(plain []byte) (*Event, error) {
	var x xmlEvent
	if err := xml.Unmarshal(plain, &x); err != nil {
		return nil, fmt.Errorf("%w: event: %v", ErrMalformed, err)
	}
	e := &Event{
		ToUserName: strings.TrimSpace(x.ToUserName),
		MsgType:    strings.TrimSpace(x.MsgType),
		Event:      strings.TrimSpace(x.Event),
		Token:      strings.TrimSpace(x.Token),
		OpenKfID:   strings.TrimSpace(x.OpenKfID),
	}
	for _, a := range x.AuthAdd {
		if a = strings.TrimSpace(a); a != "" {
			e.AuthAdd = append(e.AuthAdd, a)
		}
	}
	for _, a := range x.AuthDel {
		if a = strings.TrimSpace(a); a != "" {
			e.AuthDel = append(e.AuthDel, a)
		}
	}
	if e.MsgType == "" {
		return nil, fmt.Errorf("%w: event has no MsgType", ErrMalformed)
	}
	if ct := strings.TrimSpace(x.CreateTime); ct != "" {
		v, err := strconv.ParseInt(ct, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: CreateTime %q is not a number", ErrMalformed, truncate([]byte(ct), 32))
		}
		e.CreateTime = v
	}
	if e.IsKFMsgOrEvent() && e.OpenKfID == "" {
		return nil, fmt.Errorf("%w: %s without OpenKfId", ErrMalformed, EventKFMsgOrEvent)
	}
	return e, nil
}

// MarshalEventXML renders e as WeChat's plaintext callback XML (CDATA
// sections, as WeChat sends them).
func MarshalEventXML(e *Event) []byte {
	var b strings.Builder
	b.WriteString("<xml><ToUserName><![CDATA[")
	b.WriteString(cdata(e.ToUserName))
	b.WriteString("]]></ToUserName><CreateTime>")
	b.WriteString(strconv.FormatInt(e.CreateTime, 10))
	b.WriteString("</CreateTime><MsgType><![CDATA[")
	b.WriteString(cdata(e.MsgType))
	b.WriteString("]]></MsgType><Event><![CDATA[")
	b.WriteString(cdata(e.Event))
	b.WriteString("]]></Event><Token><![CDATA[")
	b.WriteString(cdata(e.Token))
	b.WriteString("]]></Token><OpenKfId><![CDATA[")
	b.WriteString(cdata(e.OpenKfID))
	b.WriteString("]]></OpenKfId>")
	for _, a := range e.AuthAdd {
		b.WriteString("<AuthAddOpenKfId><![CDATA[" + cdata(a) + "]]></AuthAddOpenKfId>")
	}
	for _, a := range e.AuthDel {
		b.WriteString("<AuthDelOpenKfId><![CDATA[" + cdata(a) + "]]></AuthDelOpenKfId>")
	}
	b.WriteString("</xml>")
	return []byte(b.String())
}

// MarshalEnvelopeXML renders the outer POST body WeChat sends.
func MarshalEnvelopeXML(env *Envelope) []byte {
	return []byte("<xml><ToUserName><![CDATA[" + cdata(env.ToUserName) + "]]></ToUserName><Encrypt><![CDATA[" +
		cdata(env.Encrypt) + "]]></Encrypt><AgentID><![CDATA[" + cdata(env.AgentID) + "]]></AgentID></xml>")
}

// cdata makes s safe inside a CDATA section by splitting any "]]>".
func cdata(s string) string {
	return strings.ReplaceAll(s, "]]>", "]]]]><![CDATA[>")
}
