package idgen

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every keepalive goroutine must be gone once Stop or its ctx ended it.
	goleak.VerifyTestMain(m)
}
