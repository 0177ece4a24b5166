package testenv

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Ports handed out by FreePort come from below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), never from it: a port that the
// kernel picked for ":0" a moment ago can meanwhile become the local end of
// an outgoing connection, and the daemon given it then fails to start
// ("bind: address already in use"; a loaded CI run lost a chaos scenario to
// that). Within the process a cursor hands out each port once per lap;
// processes start at different points of the range.
const (
	portRangeLo = 24000 // above the services' fixed ports and the etcd cluster's
	portRangeHi = 32768 // the default start of the ephemeral range
)

var portCursor atomic.Int64

func init() { portCursor.Store(int64(os.Getpid()*7919) % (portRangeHi - portRangeLo)) }

// ephemeralLo is where the kernel's ephemeral ports start.
func ephemeralLo() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > portRangeLo {
				return min(v, portRangeHi)
			}
		}
	}
	return portRangeHi
}

// FreePort returns a loopback port that was free a moment ago, from below
// the ephemeral range when it has one free.
func FreePort(t testing.TB) int {
	t.Helper()
	if p, ok := freeRun(1); ok {
		return p
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// freeRun takes the cursor's next n ports and returns the first when all n
// could be listened on.
func freeRun(n int) (int, bool) {
	hi := ephemeralLo()
	span := int64(hi - portRangeLo)
	if span < int64(n) {
		return 0, false
	}
	for range 200 {
		end := portCursor.Add(int64(n))
		p := portRangeLo + int((end-int64(n)+1)%span)
		if p+n > hi || !PortsFree(p, n) {
			continue
		}
		return p, true
	}
	return 0, false
}

// PortsFree reports whether p … p+n-1 on loopback could all be listened
// on a moment ago.
func PortsFree(p, n int) bool {
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
		if err != nil {
			return false
		}
		held = append(held, ln)
	}
	return true
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
	return FreePortRange(t, 2)
}

// FreePortRange returns p such that p … p+n-1 were all free a moment ago,
// below the ephemeral range when it can.
func FreePortRange(t testing.TB, n int) int {
	t.Helper()
	if p, ok := freeRun(n); ok {
		return p
	}
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if p+n <= 65536 && PortsFree(p, n) {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}
