// Package wecom speaks to WeChat Work (企业微信) for the customer-service
// (KF, 微信客服) pipeline: the callback crypto (signature, AES-256-CBC with
// PKCS#7 padding to 32 bytes), callback parsing, the HTTP callback handler,
// the access-token cache and the sync_msg client.
//
// The package depends only on the standard library, go-redis, prometheus
// and zap so that every daemon can use it.
package wecom

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Errors of the callback crypto. Decrypt wraps them, so test with errors.Is.
var (
	// ErrBadSignature is returned by the handler's checks (and by
	// DecryptVerified) when msg_signature does not match the request.
	ErrBadSignature = errors.New("wecom: bad signature")
	// ErrBadPadding is returned by Decrypt when the PKCS#7 padding (block
	// size 32, pad value 1..32) is invalid: wrong key or tampered data.
	ErrBadPadding = errors.New("wecom: bad padding")
	// ErrReceiveIDMismatch is returned by Decrypt when the plaintext is
	// well formed but addressed to another receive ID (corp ID): the
	// message was meant for someone else.
	ErrReceiveIDMismatch = errors.New("wecom: receive id mismatch")
	// ErrMalformed is returned by Decrypt, ParseEnvelope and ParseEvent when
	// the input is not valid base64, not a whole number of AES blocks, has an
	// impossible length field, or is not the expected XML.
	ErrMalformed = errors.New("wecom: malformed message")
)

// padBlock is WeChat's PKCS#7 block size: 32 bytes, not AES's 16.
const padBlock = 32

// Crypto signs, verifies, encrypts and decrypts WeChat Work callback
// payloads for one (token, EncodingAESKey, receive ID) triple. It is safe
// for concurrent use.
type Crypto struct {
	token     string
	key       []byte
	block     cipher.Block
	receiveID []byte
	// rand is the source of the 16 random leading bytes; tests replace it to
	// reproduce official ciphertexts byte for byte.
	rand io.Reader
}

// NewCrypto returns a Crypto for the callback token, the 43-character
// EncodingAESKey and the receive ID (the corp ID for KF callbacks). The
// error names the argument that is wrong.
func NewCrypto(token, encodingAESKey, receiveID string) (*Crypto, error) {
	if token == "" {
		return nil, errors.New("wecom: token must not be empty")
	}
	if receiveID == "" {
		return nil, errors.New("wecom: receive id (corp id) must not be empty")
	}
	if len(encodingAESKey) != 43 {
		return nil, fmt.Errorf("wecom: encoding_aes_key must be 43 characters, got %d", len(encodingAESKey))
	}
	key, err := base64.StdEncoding.DecodeString(encodingAESKey + "=")
	if err != nil {
		return nil, fmt.Errorf("wecom: encoding_aes_key is not base64: %w", err)
	}
	if len(key) != 32 {
		// Unreachable for 43 valid base64 characters, kept as a guard.
		return nil, fmt.Errorf("wecom: encoding_aes_key decodes to %d bytes, want 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("wecom: encoding_aes_key: %w", err)
	}
	return &Crypto{token: token, key: key, block: block, receiveID: []byte(receiveID), rand: rand.Reader}, nil
}

// ReceiveID returns the receive ID the Crypto accepts.
func (c *Crypto) ReceiveID() string { return string(c.receiveID) }

// Signature returns WeChat's msg_signature: the lowercase hex SHA-1 of
// token, timestamp, nonce and the encrypted text, sorted and concatenated.
func (c *Crypto) Signature(timestamp, nonce, encrypted string) string {
	parts := []string{c.token, timestamp, nonce, encrypted}
	sort.Strings(parts)
	sum := sha1.Sum([]byte(strings.Join(parts, "")))
	return hex.EncodeToString(sum[:])
}

// Verify reports whether sig is the signature of the other arguments. The
// comparison is constant-time so the signature cannot be guessed byte by
// byte from response timings.
func (c *Crypto) Verify(sig, timestamp, nonce, encrypted string) bool {
	want := c.Signature(timestamp, nonce, encrypted)
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// Decrypt decrypts a base64 Encrypt field (or echostr) and returns the
// message after checking padding, the length field and the receive ID.
// Errors wrap ErrMalformed, ErrBadPadding or ErrReceiveIDMismatch.
func (c *Crypto) Decrypt(encrypted string) ([]byte, error) {
	ct, err := base64.StdEncoding.DecodeString(encrypted)
	if err != nil {
		return nil, fmt.Errorf("%w: base64: %v", ErrMalformed, err)
	}
	if len(ct) == 0 || len(ct)%aes.BlockSize != 0 {
		return nil, fmt.Errorf("%w: ciphertext length %d is not a positive multiple of %d", ErrMalformed, len(ct), aes.BlockSize)
	}
	pt := make([]byte, len(ct))
	cipher.NewCBCDecrypter(c.block, c.key[:aes.BlockSize]).CryptBlocks(pt, ct)

	pad := int(pt[len(pt)-1])
	if pad < 1 || pad > padBlock || pad > len(pt) {
		return nil, fmt.Errorf("%w: pad value %d", ErrBadPadding, pad)
	}
	for _, b := range pt[len(pt)-pad:] {
		if int(b) != pad {
			return nil, fmt.Errorf("%w: inconsistent pad bytes", ErrBadPadding)
		}
	}
	pt = pt[:len(pt)-pad]

	// random(16) | msgLen(4, big-endian) | msg | receiveid
	if len(pt) < 20 {
		return nil, fmt.Errorf("%w: plaintext of %d bytes is shorter than its header", ErrMalformed, len(pt))
	}
	n := binary.BigEndian.Uint32(pt[16:20])
	if uint64(n) > uint64(len(pt)-20) {
		return nil, fmt.Errorf("%w: message length %d exceeds plaintext", ErrMalformed, n)
	}
	msg := pt[20 : 20+int(n)]
	if rid := pt[20+int(n):]; !bytes.Equal(rid, c.receiveID) {
		return nil, fmt.Errorf("%w: got %q", ErrReceiveIDMismatch, truncate(rid, 64))
	}
	return msg, nil
}

// DecryptVerified checks the signature and then decrypts: ErrBadSignature
// when the signature does not match, otherwise Decrypt's result.
func (c *Crypto) DecryptVerified(sig, timestamp, nonce, encrypted string) ([]byte, error) {
	if !c.Verify(sig, timestamp, nonce, encrypted) {
		return nil, ErrBadSignature
	}
	return c.Decrypt(encrypted)
}

// Encrypt is the inverse of Decrypt: it returns the base64 ciphertext of
// random(16) | len(msg) | msg | receiveid, padded to a multiple of 32.
func (c *Crypto) Encrypt(msg []byte) (string, error) {
	if uint64(len(msg)) > uint64(^uint32(0)) {
		return "", fmt.Errorf("wecom: message of %d bytes is too long", len(msg))
	}
	n := 20 + len(msg) + len(c.receiveID)
	pad := padBlock - n%padBlock // 1..32: a full block when already aligned
	pt := make([]byte, n+pad)
	if _, err := io.ReadFull(c.rand, pt[:16]); err != nil {
		return "", fmt.Errorf("wecom: random prefix: %w", err)
	}
	binary.BigEndian.PutUint32(pt[16:20], uint32(len(msg)))
	copy(pt[20:], msg)
	copy(pt[20+len(msg):], c.receiveID)
	for i := n; i < len(pt); i++ {
		pt[i] = byte(pad)
	}
	cipher.NewCBCEncrypter(c.block, c.key[:aes.BlockSize]).CryptBlocks(pt, pt)
	return base64.StdEncoding.EncodeToString(pt), nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
