package idgen

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestUUID(t *testing.T) {
	seen := make(map[string]bool)
	prev := ""
	for i := range 10_000 {
		if i == 5000 {
			time.Sleep(2 * time.Millisecond) // later millisecond ⇒ larger string
		}
		s := UUID()
		u, err := uuid.Parse(s)
		if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("UUID() = %q: version %d variant %v err %v", s, u.Version(), u.Variant(), err)
		}
		if seen[s] {
			t.Fatalf("duplicate %s", s)
		}
		seen[s] = true
		if i == 5000 && s <= prev {
			t.Fatalf("%s not after %s from an earlier millisecond", s, prev)
		}
		prev = s
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("no entropy") }

func TestUUIDWithoutRandomness(t *testing.T) {
	uuid.SetRand(failingReader{})
	defer uuid.SetRand(nil)
	if s, err := NewUUID(); err == nil {
		t.Fatalf("NewUUID with a failing source = %q, want an error", s)
	}
	a, b := UUID(), UUID()
	for _, s := range []string{a, b} {
		u, err := uuid.Parse(s)
		if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("fallback UUID() = %q: version %d variant %v err %v", s, u.Version(), u.Variant(), err)
		}
		if at := time.Unix(u.Time().UnixTime()); time.Since(at).Abs() > time.Minute {
			t.Fatalf("fallback UUID time %s, want now", at)
		}
	}
	if a == b {
		t.Fatalf("fallback UUIDs repeat: %s", a)
	}
}
