package permanent

import (
	"errors"
	"fmt"
	"testing"
)

// coded is an error that classifies itself, as WeChat's error types do.
type coded struct{ retryable bool }

func (c coded) Error() string   { return "coded" }
func (c coded) Permanent() bool { return !c.retryable }

func TestIs(t *testing.T) {
	plain := errors.New("plain")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", plain, false},
		{"marked", Mark(plain), true},
		{"marked, wrapped", fmt.Errorf("ctx: %w", Mark(plain)), true},
		{"permanent by its own classification", coded{}, true},
		{"retryable by its own classification", coded{retryable: true}, false},
		{"wrapped classification", fmt.Errorf("send: %w", coded{}), true},
		{"retryable marked", Mark(coded{retryable: true}), true},
		{"joined", errors.Join(plain, fmt.Errorf("x: %w", coded{})), true},
		{"joined, none", errors.Join(plain, coded{retryable: true}), false},
		{"two %w", fmt.Errorf("%w: %w", plain, Mark(plain)), true},
	}
	for _, tt := range tests {
		if got := Is(tt.err); got != tt.want {
			t.Errorf("%s: Is(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestMark(t *testing.T) {
	if Mark(nil) != nil {
		t.Fatal("Mark(nil) is not nil")
	}
	base := errors.New("bad input")
	err := Mark(base)
	if !errors.Is(err, base) {
		t.Fatal("Mark hides the error it marks")
	}
	if err.Error() != "permanent: bad input" {
		t.Fatalf("Error() = %q", err.Error())
	}
}
