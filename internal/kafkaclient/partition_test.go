package kafkaclient

import (
	"fmt"
	"testing"
)

// KeyPartition must agree with the Java partitioner the round-trip test
// checks librdkafka against.
func TestKeyPartitionMatchesJava(t *testing.T) {
	for _, parts := range []int{1, 3, 6, 12} {
		for i := range 500 {
			key := fmt.Sprintf("wm-user-%d", i)
			if got, want := KeyPartition(key, parts), javaPartition(key, parts); got != want {
				t.Fatalf("KeyPartition(%q, %d) = %d, Java: %d", key, parts, got, want)
			}
		}
	}
	if got := KeyPartition("x", 0); got != 0 {
		t.Fatalf("no partitions: %d", got)
	}
}
