package chaos

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// FaultProxy is Shopify's toxiproxy, its API server run in the test
// process on a free port and driven through its own client, as a
// deployment would drive it: TCP proxies between a daemon and a service
// that add latency, cut the link (blackhole) or reset it on demand.
type FaultProxy struct {
	*toxiclient.Client
}

// StartFaultProxy starts toxiproxy's API server (it lives until the test
// binary exits) and waits until it answers.
func StartFaultProxy(t *testing.T) *FaultProxy {
	t.Helper()
	port := testenv.FreePort(t)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	go srv.Listen("127.0.0.1", strconv.Itoa(port))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/version")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("toxiproxy API not answering on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &FaultProxy{Client: toxiclient.NewClient(addr)}
}

// Link creates a proxy named name on a free loopback port to upstream and
// returns it; its Listen field is the address to give the daemon.
func (f *FaultProxy) Link(t *testing.T, name, upstream string) *toxiclient.Proxy {
	t.Helper()
	p, err := f.CreateProxy(name, fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), upstream)
	if err != nil {
		t.Fatalf("toxiproxy: create %s → %s: %v", name, upstream, err)
	}
	t.Cleanup(func() { _ = p.Delete() })
	return p
}

// Latency adds delay to everything upstream sends back through p (each
// request/answer round trip takes delay longer).
func Latency(p *toxiclient.Proxy, delay time.Duration) error {
	_, err := p.AddToxic("latency", "latency", "downstream", 1, toxiclient.Attributes{"latency": delay.Milliseconds()})
	return err
}

// Blackhole stops every byte through p in both directions while the
// connections stay open (a network partition, not a refused connection).
func Blackhole(p *toxiclient.Proxy) error {
	for _, stream := range []string{"upstream", "downstream"} {
		if _, err := p.AddToxic("blackhole-"+stream, "timeout", stream, 1, toxiclient.Attributes{"timeout": 0}); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes every toxic from p.
func Heal(p *toxiclient.Proxy) error {
	ts, err := p.Toxics()
	if err != nil {
		return err
	}
	for _, tx := range ts {
		if err := p.RemoveToxic(tx.Name); err != nil {
			return err
		}
	}
	return nil
}

// PrivateKafkaBehind starts a single-node Kafka of the scenario's own with
// a second listener, PROXIED, whose advertised address is a toxiproxy
// link: a client that bootstraps from the link's address is told to reach
// the broker through it for everything, while clients of Node.Addr talk
// to the broker directly.
func PrivateKafkaBehind(t *testing.T, f *FaultProxy) (*Node, *toxiclient.Proxy) {
	t.Helper()
	testenv.Tool(t, "java")
	port, proxied := testenv.FreePortPair(t), testenv.FreePort(t)
	link := f.Link(t, "kafka-"+testenv.Short(), fmt.Sprintf("127.0.0.1:%d", proxied))
	n := startNode(t, "kafka.sh", "kafka", port, nil,
		"--set", fmt.Sprintf("listeners=PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d,PROXIED://127.0.0.1:%d", port, port+1, proxied),
		"--set", fmt.Sprintf("advertised.listeners=PLAINTEXT://127.0.0.1:%d,PROXIED://%s", port, link.Listen),
		"--set", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,PROXIED:PLAINTEXT")
	return n, link
}
