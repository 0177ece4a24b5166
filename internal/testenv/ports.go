package testenv

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// FreeAddr returns "127.0.0.1:port" for a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// FreePortPair returns p such that p and p+1 were both free: a Kafka node
// started by scripts/kafka.sh uses p for the broker and p+1 for its
// controller.
func FreePortPair(t testing.TB) int {
	t.Helper()
	for range 50 {
		p := FreePort(t)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		if err == nil {
			_ = ln.Close()
			return p
		}
	}
	t.Fatal("no free port pair")
	return 0
}
