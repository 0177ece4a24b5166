package kfpipe_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestRunConsumerUnreachableKafka: a bot started where no Kafka listens
// returns one error naming kafka.brokers, its value and --simulate, within
// seconds, instead of starting a consumer that logs connection errors.
func TestRunConsumerUnreachableKafka(t *testing.T) {
	addr := closedAddr(t)
	t.Setenv("KFPIPE_CONFIG", "")
	t.Setenv("KFPIPE_KAFKA_BROKERS", addr)
	start := time.Now()
	err := kfpipe.RunConsumer(context.Background(), nil, silentBot)
	took := time.Since(start)
	if err == nil {
		t.Fatal("RunConsumer with no Kafka reachable returned nil")
	}
	for _, want := range []string{"kafka.brokers", addr, "KFPIPE_KAFKA_BROKERS", "--simulate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %q: %v", want, err)
		}
	}
	if took > 15*time.Second {
		t.Errorf("RunConsumer took %v to give up", took)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}

// TestHelp: -h and --help ask for the usage, which names the program and
// its flags, --simulate with it.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"--config", "x.yaml", "-help"}} {
		if !kfpipe.HelpAsked(args) {
			t.Errorf("HelpAsked(%q) = false", args)
		}
	}
	if kfpipe.HelpAsked([]string{"--config", "help.yaml"}) {
		t.Error("HelpAsked of a file named help.yaml")
	}
	var b bytes.Buffer
	kfpipe.PrintUsage(&b, true)
	for _, want := range []string{"Usage of kfpipe.test", "--config FILE", "--simulate[=ADDR]", "--help"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the usage does not say %q:\n%s", want, b.String())
		}
	}
	if err := kfpipe.RunConsumer(context.Background(), []string{"--help"}, silentBot); err != nil {
		t.Errorf("RunConsumer --help: %v, want nil", err)
	}
}

// silentBot is a bot that answers nothing.
var silentBot = kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error { return nil })
