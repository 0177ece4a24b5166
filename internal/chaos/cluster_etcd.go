package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// EtcdCluster is a private three-member etcd cluster (scripts/etcd.sh
// start-cluster) on loopback: member i (1..3) serves clients on
// Endpoints[i-1].
type EtcdCluster struct {
	Endpoints []string

	script *Node            // runs scripts/etcd.sh with --name of the cluster
	cli    *clientv3.Client // on every member, without namespace
	ids    [3]uint64        // raft member ID of member i+1
}

// PrivateEtcdCluster starts a three-member etcd cluster of the scenario's
// own and learns its member IDs. It is stopped at test cleanup.
func PrivateEtcdCluster(t *testing.T) *EtcdCluster {
	t.Helper()
	testenv.Tool(t, "etcd")
	base := stablePortRange(t, 6)
	c := &EtcdCluster{script: &Node{t: t, script: "etcd.sh", name: "chaos-" + testenv.Short(), runDir: t.TempDir()}}
	c.script.env = []string{"KFPIPE_RUN_DIR=" + c.script.runDir}
	t.Cleanup(func() {
		if err := c.script.run("stop-cluster"); err != nil {
			t.Logf("stop private etcd cluster: %v", err)
		}
	})
	start := time.Now()
	if err := c.script.run("start-cluster", "--base-port", strconv.Itoa(base)); err != nil {
		t.Fatalf("private etcd cluster: %v", err)
	}
	for i := range 3 {
		c.Endpoints = append(c.Endpoints, "http://127.0.0.1:"+strconv.Itoa(base+2*i))
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd status client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	c.cli = cli
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, ep := range c.Endpoints {
		resp, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of etcd member %d: %v", i+1, err)
		}
		c.ids[i] = resp.Header.MemberId
	}
	t.Logf("private etcd cluster %s on %v ready in %s", c.script.name, c.Endpoints, time.Since(start).Round(time.Millisecond))
	return c
}

// Client returns a client on every member, without namespace, for reading
// what etcd stored (closed at cleanup).
func (c *EtcdCluster) Client() *clientv3.Client { return c.cli }

// Kill9 SIGKILLs member i (1..3).
func (c *EtcdCluster) Kill9(i int) error { return c.script.run("kill9", "--member", strconv.Itoa(i)) }

// Resume starts member i again on its data; it waits until the member is
// healthy when another member runs.
func (c *EtcdCluster) Resume(i int) error { return c.script.run("resume", "--member", strconv.Itoa(i)) }

// Leader returns the member (1..3) that answers within timeout as the
// leader, or 0 when none does (an election is under way, or no quorum is
// up). Only the leader's own word counts: a follower may still name a
// leader that was killed a moment ago.
func (c *EtcdCluster) Leader(ctx context.Context, timeout time.Duration) int {
	for i, ep := range c.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := c.cli.Status(sctx, ep)
		cancel()
		if err == nil && resp.Leader != 0 && resp.Leader == c.ids[i] {
			return i + 1
		}
	}
	return 0
}

// AwaitLeader polls until a member other than not leads and returns it, or
// fails after within.
func (c *EtcdCluster) AwaitLeader(ctx context.Context, not int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		if l := c.Leader(ctx, 300*time.Millisecond); l != 0 && l != not {
			return l, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no etcd leader other than member %d within %s", not, within)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stablePortRange returns p such that p … p+n-1 are free, from 22379 up and
// below the kernel's ephemeral port range. A member killed and resumed must
// get its ports back: a port in the ephemeral range can meanwhile become
// the local end of some outgoing connection, and the member then fails to
// start ("bind: address already in use").
func stablePortRange(t testing.TB, n int) int {
	t.Helper()
	lo, hi := 22379, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	for p := lo; p+n <= hi; p += n {
		if testenv.PortsFree(p, n) {
			return p
		}
	}
	t.Logf("no %d free ports in [%d, %d): using ephemeral ones, a resumed member may find one taken", n, lo, hi)
	return testenv.FreePortRange(t, n)
}
