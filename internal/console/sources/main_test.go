package sources

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: whoever
// starts a goroutine must stop it and wait for it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
