package state_test

import (
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/state"
)

// TestKeyPartitionAsProducer: the store places a user where the
// producer's partitioner does.
func TestKeyPartitionAsProducer(t *testing.T) {
	for i := range 2000 {
		u := fmt.Sprintf("wm%05d-%d", i, i*7919)
		for _, n := range []int{1, 4, 6, 12, 24} {
			if a, b := state.KeyPartition(u, n), kafkaclient.KeyPartition(u, n); a != b {
				t.Fatalf("KeyPartition(%q, %d) = %d, the producer's %d", u, n, a, b)
			}
		}
	}
}
