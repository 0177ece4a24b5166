package chatmsg

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// decodeFast parses the form Encode writes — one flat object with only
// ChatMessage's own keys, spelled exactly, strings without escapes,
// integers as plain digits — about 4× faster than encoding/json, which
// cost the consumer a fifth of its CPU. It reports ok=false for anything
// else (escapes, unknown or differently-cased keys, null, floats, leading
// zeros, invalid UTF-8, trailing data …) and Decode then falls back to
// encoding/json, so every input decodes to exactly what encoding/json makes
// of it and every error is encoding/json's (FuzzDecodeFast checks both).
func decodeFast(b []byte, m *ChatMessage) (ok bool) {
	d := fastDecoder{b: b}
	if !d.byte('{') {
		return false
	}
	if d.peek() == '}' {
		d.i++
		return d.end()
	}
	for {
		key, ok := d.rawString()
		if !ok || !d.byte(':') {
			return false
		}
		switch string(key) {
		case "message_id":
			v, ok := d.rawString()
			if !ok {
				return false
			}
			n, ok := parseInt(v, 64)
			if !ok {
				return false
			}
			m.MessageID = n
		case "upstream_msgid":
			ok = d.str(&m.UpstreamMsgID)
		case "open_kfid":
			ok = d.str(&m.OpenKfID)
		case "external_userid":
			ok = d.str(&m.ExternalUserID)
		case "msg_type":
			ok = d.str(&m.MsgType)
		case "servicer_userid":
			ok = d.str(&m.ServicerUserID)
		case "origin":
			var n int64
			n, ok = d.int(strconv.IntSize)
			m.Origin = int(n)
		case "send_time":
			m.SendTime, ok = d.int(64)
		case "produced_at":
			m.ProducedAt, ok = d.int(64)
		case "content":
			var v []byte
			if v, ok = d.value(); ok {
				m.Content = json.RawMessage(append([]byte(nil), v...))
			}
		default:
			return false // unknown keys may match a field case-insensitively
		}
		if !ok {
			return false
		}
		d.ws()
		if d.i >= len(d.b) {
			return false
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return d.end()
		default:
			return false
		}
	}
}

type fastDecoder struct {
	b []byte
	i int
}

func (d *fastDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *fastDecoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// byte consumes c after optional whitespace.
func (d *fastDecoder) byte(c byte) bool {
	if d.peek() != c {
		return false
	}
	d.i++
	return true
}

// end reports whether only whitespace is left.
func (d *fastDecoder) end() bool {
	d.ws()
	return d.i == len(d.b)
}

// rawString returns the contents of a string without escapes or control
// characters, in valid UTF-8.
func (d *fastDecoder) rawString() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return nil, false // encoding/json replaces invalid bytes
			}
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func (d *fastDecoder) str(dst *string) bool {
	s, ok := d.rawString()
	if ok {
		*dst = string(s)
	}
	return ok
}

// int parses a JSON integer into bits bits.
func (d *fastDecoder) int(bits int) (int64, bool) {
	d.ws()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	return parseInt(d.b[start:d.i], bits)
}

// parseInt parses -?digits without leading zeros (JSON's grammar).
func parseInt(s []byte, bits int) (int64, bool) {
	digits := s
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(s), 10, bits)
	return n, err == nil
}

// value returns the next JSON value's bytes after checking them with
// json.Valid; finding its end needs only string and bracket structure (a
// wrong guess yields invalid JSON or a syntax error after it, and Decode
// falls back).
func (d *fastDecoder) value() ([]byte, bool) {
	d.ws()
	start, depth := d.i, 0
	composite := d.i < len(d.b) && (d.b[d.i] == '"' || d.b[d.i] == '{' || d.b[d.i] == '[')
scan:
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			for d.i++; d.i < len(d.b) && d.b[d.i] != '"'; d.i++ {
				if d.b[d.i] == '\\' {
					d.i++
				}
			}
			if d.i >= len(d.b) {
				return nil, false
			}
			d.i++
		case c == '{' || c == '[':
			depth++
			d.i++
		case c == '}' || c == ']':
			if depth == 0 {
				break scan // the end of a scalar, at the enclosing object's end
			}
			depth--
			d.i++
		case depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			break scan
		default:
			d.i++
		}
		if composite && depth == 0 {
			break
		}
	}
	v := d.b[start:d.i]
	if len(v) == 0 || !json.Valid(v) {
		return nil, false
	}
	return v, true
}
