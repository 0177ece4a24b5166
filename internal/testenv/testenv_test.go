package testenv

import (
	"regexp"
	"testing"
)

func TestNameIsAValidTopicName(t *testing.T) {
	n := Name(t, "topic")
	if !regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`).MatchString(n) {
		t.Fatalf("%q is not a legal Kafka topic name", n)
	}
	if Name(t, "topic") == n {
		t.Fatal("two names are equal")
	}
}
