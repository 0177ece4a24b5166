package wecom

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// Official test vectors from WeChat Work's callback documentation.
const (
	vecToken     = "QDG6eK"
	vecAESKey    = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
	vecReceiveID = "wx5823bf96d3bd56c7"

	vecVerifySig   = "5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3"
	vecVerifyTS    = "1409659589"
	vecVerifyNonce = "263014780"
	vecEchoStr     = "P9nAzCzyDtyTWESHep1vC5X9xho/qYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp+4RPcs8TgAE7OaBO+FZXvnaqQ=="
	vecEchoPlain   = "1616140317555161061"

	vecPostSig   = "477715d11cdb4164915debcba66cb864d751f3e6"
	vecPostTS    = "1409659813"
	vecPostNonce = "1372623149"
	vecPostEnc   = "RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q=="
)

func vecCrypto(t testing.TB) *Crypto {
	t.Helper()
	c, err := NewCrypto(vecToken, vecAESKey, vecReceiveID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewCryptoErrors(t *testing.T) {
	tests := []struct {
		name, token, key, rid, wantErr string
	}{
		{"empty token", "", vecAESKey, vecReceiveID, "token"},
		{"empty receive id", vecToken, vecAESKey, "", "receive id"},
		{"short key", vecToken, vecAESKey[:42], vecReceiveID, "43 characters, got 42"},
		{"long key", vecToken, vecAESKey + "A", vecReceiveID, "43 characters, got 44"},
		{"not base64", vecToken, strings.Repeat("!", 43), vecReceiveID, "not base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewCrypto(tt.token, tt.key, tt.rid)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestOfficialVectorURLVerification(t *testing.T) {
	c := vecCrypto(t)
	if got := c.Signature(vecVerifyTS, vecVerifyNonce, vecEchoStr); got != vecVerifySig {
		t.Fatalf("signature = %s, want %s", got, vecVerifySig)
	}
	if !c.Verify(vecVerifySig, vecVerifyTS, vecVerifyNonce, vecEchoStr) {
		t.Fatal("Verify rejected the official signature")
	}
	got, err := c.DecryptVerified(vecVerifySig, vecVerifyTS, vecVerifyNonce, vecEchoStr)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != vecEchoPlain {
		t.Fatalf("echostr = %q, want %q", got, vecEchoPlain)
	}
}

func TestOfficialVectorPost(t *testing.T) {
	c := vecCrypto(t)
	if got := c.Signature(vecPostTS, vecPostNonce, vecPostEnc); got != vecPostSig {
		t.Fatalf("signature = %s, want %s", got, vecPostSig)
	}
	msg, err := c.DecryptVerified(vecPostSig, vecPostTS, vecPostNonce, vecPostEnc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(msg, []byte("<xml>")) || !bytes.Contains(msg, []byte("<Content><![CDATA[hello]]></Content>")) {
		t.Fatalf("decrypted = %q", msg)
	}
	ev, err := ParseEvent(msg)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ToUserName != vecReceiveID || ev.CreateTime != 1409659813 || ev.MsgType != "text" || ev.IsKFMsgOrEvent() {
		t.Fatalf("event = %+v", ev)
	}
}

// TestEncryptReproducesOfficialCiphertext fixes the random prefix to the one
// WeChat used and checks Encrypt yields the official ciphertext byte for byte:
// length field, receive ID and 32-byte padding are exactly WeChat's.
func TestEncryptReproducesOfficialCiphertext(t *testing.T) {
	for _, enc := range []string{vecEchoStr, vecPostEnc} {
		c := vecCrypto(t)
		msg, err := c.Decrypt(enc)
		if err != nil {
			t.Fatal(err)
		}
		c.rand = bytes.NewReader(rawPlain(t, c, enc)[:16])
		got, err := c.Encrypt(msg)
		if err != nil {
			t.Fatal(err)
		}
		if got != enc {
			t.Fatalf("Encrypt = %s\nwant      %s", got, enc)
		}
	}
}

// rawPlain decrypts without any checks.
func rawPlain(t testing.TB, c *Crypto, enc string) []byte {
	t.Helper()
	ct, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	pt := make([]byte, len(ct))
	cipher.NewCBCDecrypter(c.block, c.key[:16]).CryptBlocks(pt, ct)
	return pt
}

// rawEncrypt encrypts pt (a multiple of 16 bytes) without framing.
func rawEncrypt(t testing.TB, c *Crypto, pt []byte) string {
	t.Helper()
	ct := make([]byte, len(pt))
	cipher.NewCBCEncrypter(c.block, c.key[:aes.BlockSize]).CryptBlocks(ct, pt)
	return base64.StdEncoding.EncodeToString(ct)
}

func TestEncryptDecryptRoundTrip(t *testing.T) {
	c := vecCrypto(t)
	// Lengths around every padding boundary, including the aligned case
	// that needs a whole 32-byte block of padding.
	for n := 0; n <= 100; n++ {
		msg := bytes.Repeat([]byte{'a' + byte(n%26)}, n)
		enc, err := c.Encrypt(msg)
		if err != nil {
			t.Fatal(err)
		}
		ct, _ := base64.StdEncoding.DecodeString(enc)
		if len(ct)%32 != 0 {
			t.Fatalf("n=%d: ciphertext length %d is not a multiple of 32", n, len(ct))
		}
		pt := rawPlain(t, c, enc)
		pad := int(pt[len(pt)-1])
		if pad < 1 || pad > 32 || (20+n+len(vecReceiveID)+pad)%32 != 0 {
			t.Fatalf("n=%d: pad %d", n, pad)
		}
		got, err := c.Decrypt(enc)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("n=%d: round trip = %q", n, got)
		}
	}
	a, _ := c.Encrypt([]byte("same"))
	b, _ := c.Encrypt([]byte("same"))
	if a == b {
		t.Fatal("two encryptions of one message are equal: random prefix missing")
	}
}

func TestDecryptErrors(t *testing.T) {
	c := vecCrypto(t)
	other, err := NewCrypto(vecToken, vecAESKey, "ww-someone-else")
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.Encrypt([]byte("<xml/>"))

	frame := func(n uint32, body string, pad []byte) []byte {
		pt := append(bytes.Repeat([]byte{7}, 16), byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		pt = append(pt, body...)
		return append(pt, pad...)
	}
	padded := func(n uint32, body string) []byte {
		pt := frame(n, body, nil)
		p := 32 - len(pt)%32
		return append(pt, bytes.Repeat([]byte{byte(p)}, p)...)
	}
	tests := []struct {
		name string
		enc  string
		want error
	}{
		{"not base64", "%%%", ErrMalformed},
		{"empty", "", ErrMalformed},
		{"not whole blocks", base64.StdEncoding.EncodeToString(make([]byte, 20)), ErrMalformed},
		{"pad zero", rawEncrypt(t, c, frame(1, "x"+vecReceiveID, make([]byte, 32-(21+len(vecReceiveID))%32))), ErrBadPadding},
		{"pad 33", rawEncrypt(t, c, append(make([]byte, 63), 33)), ErrBadPadding},
		{"inconsistent pad", rawEncrypt(t, c, append(make([]byte, 60), 1, 2, 4, 4)), ErrBadPadding},
		{"length beyond plaintext", rawEncrypt(t, c, padded(1000, "x"+vecReceiveID)), ErrMalformed},
		{"length field max", rawEncrypt(t, c, padded(^uint32(0), "x"+vecReceiveID)), ErrMalformed},
		{"too short for header", rawEncrypt(t, c, append(make([]byte, 16), bytes.Repeat([]byte{16}, 16)...)), ErrMalformed},
		{"other receive id", foreign, ErrReceiveIDMismatch},
		{"missing receive id", rawEncrypt(t, c, padded(1, "x")), ErrReceiveIDMismatch},
		{"receive id with suffix", rawEncrypt(t, c, padded(1, "x"+vecReceiveID+"z")), ErrReceiveIDMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Decrypt(tt.enc)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decrypt = %q, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := c.Decrypt(rawEncrypt(t, c, padded(1, "x"+vecReceiveID))); err != nil {
		t.Fatalf("control case rejected: %v", err)
	}
}

func TestVerify(t *testing.T) {
	c := vecCrypto(t)
	tests := []struct {
		name, sig, ts, nonce, enc string
		want                      bool
	}{
		{"official", vecPostSig, vecPostTS, vecPostNonce, vecPostEnc, true},
		{"uppercase hex", strings.ToUpper(vecPostSig), vecPostTS, vecPostNonce, vecPostEnc, false},
		{"empty", "", vecPostTS, vecPostNonce, vecPostEnc, false},
		{"truncated", vecPostSig[:39], vecPostTS, vecPostNonce, vecPostEnc, false},
		{"other timestamp", vecPostSig, "1409659814", vecPostNonce, vecPostEnc, false},
		{"other nonce", vecPostSig, vecPostTS, "1", vecPostEnc, false},
		{"other payload", vecPostSig, vecPostTS, vecPostNonce, vecEchoStr, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Verify(tt.sig, tt.ts, tt.nonce, tt.enc); got != tt.want {
				t.Fatalf("Verify = %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := c.DecryptVerified("bad", vecPostTS, vecPostNonce, vecPostEnc); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("DecryptVerified with a bad signature: %v", err)
	}
	other, _ := NewCrypto("another-token", vecAESKey, vecReceiveID)
	if other.Verify(vecPostSig, vecPostTS, vecPostNonce, vecPostEnc) {
		t.Fatal("a different token verified the official signature")
	}
}

func BenchmarkDecrypt(b *testing.B) {
	c := vecCrypto(b)
	b.SetBytes(int64(len(vecPostEnc)))
	for b.Loop() {
		if _, err := c.Decrypt(vecPostEnc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	c := vecCrypto(b)
	for b.Loop() {
		if !c.Verify(vecPostSig, vecPostTS, vecPostNonce, vecPostEnc) {
			b.Fatal("rejected")
		}
	}
}
