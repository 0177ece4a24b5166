package hostile_test

import (
	"bytes"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

func tokenOf(t *testing.T, e *env, role string) string {
	t.Helper()
	for _, tk := range e.dcfg.Admin.Tokens {
		if tk.Role == role {
			return tk.Token
		}
	}
	t.Fatalf("config/test.yaml has no %s token", role)
	return ""
}

func operatorToken(t *testing.T, e *env) string { return tokenOf(t, e, "operator") }
func viewerToken(t *testing.T, e *env) string   { return tokenOf(t, e, "viewer") }

// mutator derives hostile requests from valid ones with a seeded RNG.
// Callback mutations start from legitimate callbacks that were already
// delivered, so a mutation that still verifies is a replay and must not
// trigger; admin mutations never carry the operator token.
type mutator struct {
	rng      *mrand.Rand
	legit    []hreq
	cbPaths  []string
	cbBase   string
	writes   [][3]string // method, path, body; reads too
	op       string
	viewer   string
	adminURL string
}

var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch,
	http.MethodHead, http.MethodOptions, "PROPFIND", "TRACE"}

func (m *mutator) pick(s []string) string { return s[m.rng.IntN(len(s))] }

func (m *mutator) printable(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(0x21 + m.rng.IntN(0x7e-0x21+1))
	}
	return string(b)
}

func (m *mutator) bytesMutate(b []byte) []byte {
	b = bytes.Clone(b)
	switch m.rng.IntN(5) {
	case 0: // flip a byte
		if len(b) > 0 {
			b[m.rng.IntN(len(b))] ^= byte(1 + m.rng.IntN(255))
		}
	case 1: // truncate
		if len(b) > 0 {
			b = b[:m.rng.IntN(len(b))]
		}
	case 2: // insert junk
		i := 0
		if len(b) > 0 {
			i = m.rng.IntN(len(b))
		}
		junk := []byte(m.pick([]string{"<", ">", "]]>", "<![CDATA[", "&", "&amp;", "&lol;", "\x00", "\xff", "=", "+", "/",
			"<Encrypt>", "</Encrypt>", `"`, "{", "}", "null", m.printable(1 + m.rng.IntN(16))}))
		b = append(b[:i], append(junk, b[i:]...)...)
	case 3: // duplicate a slice
		if len(b) > 1 {
			i := m.rng.IntN(len(b))
			j := i + m.rng.IntN(len(b)-i)
			b = append(b, b[i:j]...)
		}
	case 4: // random bytes
		b = make([]byte, m.rng.IntN(64))
		for i := range b {
			b[i] = byte(m.rng.IntN(256))
		}
	}
	return b
}

// params splits a raw query keeping order and duplicates.
func params(raw string) []string {
	if raw == "" {
		return nil
	}
	return strings.Split(raw, "&")
}

func (m *mutator) callback() hreq {
	r := m.legit[m.rng.IntN(len(m.legit))].clone()
	base, raw, _ := strings.Cut(r.url, "?")
	ps := params(raw)
	for n := 1 + m.rng.IntN(3); n > 0; n-- {
		switch m.rng.IntN(12) {
		case 0, 1, 2:
			r.body = m.bytesMutate(r.body)
		case 3: // change one parameter's value
			if len(ps) > 0 {
				i := m.rng.IntN(len(ps))
				k, v, _ := strings.Cut(ps[i], "=")
				if m.rng.IntN(2) == 0 {
					v = string(m.bytesMutate([]byte(v)))
				} else {
					v = m.pick([]string{"", "0", "-1", "+1", "%zz", "%00", m.printable(8), strings.Repeat("9", 40)})
				}
				ps[i] = k + "=" + v
			}
		case 4: // drop a parameter
			if len(ps) > 0 {
				i := m.rng.IntN(len(ps))
				ps = append(ps[:i], ps[i+1:]...)
			}
		case 5: // a second value after the signed one
			ps = append(ps, m.pick([]string{"msg_signature", "timestamp", "nonce", "echostr"})+"="+m.printable(8))
		case 6: // a forged value before the signed one
			ps = append([]string{m.pick([]string{"msg_signature", "timestamp", "nonce"}) + "=" + m.printable(8)}, ps...)
		case 7: // swap timestamp and nonce values
			var ti, ni = -1, -1
			for i, p := range ps {
				switch {
				case strings.HasPrefix(p, "timestamp="):
					ti = i
				case strings.HasPrefix(p, "nonce="):
					ni = i
				}
			}
			if ti >= 0 && ni >= 0 {
				tv, nv := strings.TrimPrefix(ps[ti], "timestamp="), strings.TrimPrefix(ps[ni], "nonce=")
				ps[ti], ps[ni] = "timestamp="+nv, "nonce="+tv
			}
		case 8:
			r.method = m.pick(methods)
		case 9: // another delivery's body under this signature
			r.body = bytes.Clone(m.legit[m.rng.IntN(len(m.legit))].body)
		case 10:
			base = m.cbBase + m.pick([]string{"/wecom/callback/", "//wecom/callback", "/wecom/./callback",
				"/wecom/callback/..", "/wecom/%2e%2e/wecom/callback", "/WECOM/callback", "/wecom/callback%20",
				"/wecom/callback/%2e", "/admin/dlq/purge", "/metrics"})
		case 11:
			switch m.rng.IntN(4) {
			case 0:
				r.header.Set("Content-Type", m.pick([]string{"application/json", "text/plain", "application/xml; charset=gbk", "multipart/form-data"}))
			case 1:
				r.chunked = true
			case 2:
				r.header.Set("Content-Encoding", m.pick([]string{"gzip", "deflate", "br"}))
			case 3:
				r.header.Set("X-Forwarded-For", m.printable(12))
			}
		}
	}
	r.url = base
	if len(ps) > 0 {
		r.url += "?" + strings.Join(ps, "&")
	}
	return r
}

// notOperator returns a credential that is anything but the operator
// token: viewer, nothing, or the operator token altered.
func (m *mutator) notOperator() []string {
	switch m.rng.IntN(6) {
	case 0:
		return nil
	case 1:
		return []string{"Bearer " + m.viewer}
	case 2:
		return []string{m.pick([]string{"Basic", "Token", "bearer", "Bearer", "BEARER", "Digest", ""}) + " " + m.alteredOp()}
	default:
		return []string{"Bearer " + m.alteredOp()}
	}
}

// alteredOp is the operator token changed in at least one non-space byte.
func (m *mutator) alteredOp() string {
	for {
		b := []byte(m.op)
		switch m.rng.IntN(6) {
		case 0:
			b[m.rng.IntN(len(b))] = m.printable(1)[0]
		case 1:
			i := m.rng.IntN(len(b))
			b = append(b[:i], b[i+1:]...)
		case 2:
			b = b[:m.rng.IntN(len(b))]
		case 3:
			b = append(b, m.printable(1+m.rng.IntN(4))...)
		case 4:
			b = append([]byte(m.printable(1+m.rng.IntN(4))), b...)
		case 5:
			b = bytes.ToUpper(b)
		}
		if s := string(b); s != m.op {
			return s
		}
	}
}

func (m *mutator) admin() hreq {
	w := m.writes[m.rng.IntN(len(m.writes))]
	method, path, body := w[0], w[1], []byte(w[2])
	h := http.Header{"Content-Type": {"application/json"}}
	if a := m.notOperator(); a != nil {
		h["Authorization"] = a
	}
	if m.rng.IntN(5) == 0 { // another last segment
		i := strings.LastIndexByte(path, '/')
		path = path[:i+1] + m.pick([]string{"..%2f..%2fpurge", "%2e%2e", "%00", "..", ".", "%2f", "a%0d%0ab",
			strings.Repeat("x", 300), "blocked-1%00", "*", "%252e%252e"})
	}
	if m.rng.IntN(3) == 0 {
		body = m.bytesMutate(body)
	}
	if m.rng.IntN(10) == 0 {
		method = m.pick(methods)
	}
	if m.rng.IntN(5) == 0 {
		h.Set("Content-Type", m.pick([]string{"text/plain", "application/x-www-form-urlencoded", "", "application/json; charset=utf-16"}))
	}
	if m.rng.IntN(10) == 0 {
		h.Set(m.pick([]string{"X-Http-Method-Override", "X-Method-Override", "X-Http-Method"}), m.pick(methods))
	}
	if m.rng.IntN(10) == 0 {
		path += m.pick([]string{"?_method=POST", "?token=" + m.op[:4], "?reason=x&role=operator", "?limit=0", "?cursor=%00"})
	}
	return hreq{method: method, url: m.adminURL + path, header: h, body: body}
}
