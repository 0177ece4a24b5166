package idgen

import (
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// NewUUID returns a new UUIDv7 (time-ordered) string. It fails only if the
// random source does.
func NewUUID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// UUID returns a new UUIDv7 string and never fails or panics: if the
// package's random source fails (crypto/rand does not since Go 1.24, but
// uuid.SetRand may install one that does) it builds the UUIDv7 itself from
// the clock and the runtime's ChaCha8 generator.
func UUID() string {
	if s, err := NewUUID(); err == nil {
		return s
	}
	var u uuid.UUID
	ms := uint64(time.Now().UnixMilli())
	binary.BigEndian.PutUint64(u[8:], rand.Uint64())
	binary.BigEndian.PutUint64(u[0:], ms<<16|rand.Uint64()&0x0fff)
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 4122 variant
	return u.String()
}
