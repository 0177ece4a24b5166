package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// Cluster is a private three-node KRaft cluster (scripts/kafka.sh
// start-cluster): node i is Nodes[i-1], with node.id i, on loopback.
type Cluster struct {
	Nodes   []*Node
	Brokers string // all three bootstrap addresses
}

// PrivateKafkaCluster starts a three-node Kafka cluster of the scenario's
// own (replication factor 3, min.insync.replicas 2 by default for topics the
// brokers create; the daemons create theirs with the factors they are
// given). It is stopped at test cleanup.
func PrivateKafkaCluster(t *testing.T) *Cluster {
	t.Helper()
	testenv.Tool(t, "java")
	base := testenv.FreePortRange(t, 6)
	c := &Node{t: t, script: "kafka.sh", name: "chaos-" + testenv.Short(), runDir: t.TempDir()}
	c.env = []string{"KFPIPE_RUN_DIR=" + c.runDir}
	t.Cleanup(func() {
		if err := c.run("stop-cluster"); err != nil {
			t.Logf("stop private cluster: %v", err)
		}
	})
	start := time.Now()
	if err := c.run("start-cluster", "--base-port", strconv.Itoa(base)); err != nil {
		t.Fatalf("private kafka cluster: %v", err)
	}
	cl := &Cluster{}
	var addrs []string
	for i := 1; i <= 3; i++ {
		n := &Node{t: t, script: "kafka.sh", name: fmt.Sprintf("%s-%d", c.name, i), runDir: c.runDir, env: c.env,
			Addr: "127.0.0.1:" + strconv.Itoa(base+2*(i-1))}
		cl.Nodes = append(cl.Nodes, n)
		addrs = append(addrs, n.Addr)
	}
	cl.Brokers = strings.Join(addrs, ",")
	t.Logf("private kafka cluster %s on %s ready in %s", c.name, cl.Brokers, time.Since(start).Round(time.Millisecond))
	return cl
}

func (c *Cluster) admin() (*kafka.AdminClient, error) {
	// log_level 2: a dead node's connection errors are the point of the
	// scenario, not news.
	return kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": c.Brokers, "log_level": 2})
}

// Leaders returns, for each partition of topic, the node.id of its leader
// (-1 while it has none), as the cluster's metadata says.
func (c *Cluster) Leaders(topic string) (map[int32]int32, error) {
	tm, err := c.metadata(topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int32{}
	for _, p := range tm.Partitions {
		out[p.ID] = p.Leader
	}
	return out, nil
}

// Replication returns the smallest replica count over topic's partitions
// and the topic's min.insync.replicas.
func (c *Cluster) Replication(ctx context.Context, topic string) (replicas int, minISR string, err error) {
	tm, err := c.metadata(topic)
	if err != nil {
		return 0, "", err
	}
	replicas = -1
	for _, p := range tm.Partitions {
		if replicas < 0 || len(p.Replicas) < replicas {
			replicas = len(p.Replicas)
		}
	}
	ac, err := c.admin()
	if err != nil {
		return 0, "", err
	}
	defer ac.Close()
	res, err := ac.DescribeConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: topic}})
	if err != nil {
		return 0, "", err
	}
	for _, r := range res {
		if e, ok := r.Config["min.insync.replicas"]; ok {
			minISR = e.Value
		}
	}
	return replicas, minISR, nil
}

func (c *Cluster) metadata(topic string) (kafka.TopicMetadata, error) {
	ac, err := c.admin()
	if err != nil {
		return kafka.TopicMetadata{}, err
	}
	defer ac.Close()
	md, err := ac.GetMetadata(&topic, false, 10000)
	if err != nil {
		return kafka.TopicMetadata{}, err
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() != kafka.ErrNoError {
		return kafka.TopicMetadata{}, fmt.Errorf("metadata of %s: %v", topic, tm.Error)
	}
	return tm, nil
}

// Node returns the node with node.id id (1..3).
func (c *Cluster) Node(id int32) *Node { return c.Nodes[id-1] }
