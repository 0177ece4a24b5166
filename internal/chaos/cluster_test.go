package chaos

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"
)

// TestChaosBrokerLoss (full suite only): a private three-node cluster,
// topics with replication factor 3 and min.insync.replicas 2. Under load,
// node 2 is killed with SIGKILL and resumed later; then the node leading
// most partitions of the main topic (the hottest broker) is killed and
// resumed. With acks=all and two in-sync replicas left, every
// acknowledged record survives the leader's loss: nothing is lost,
// repeated or reordered.
func TestChaosBrokerLoss(t *testing.T) {
	SkipUnlessFull(t)
	svc := NeedServices(t)
	cl := PrivateKafkaCluster(t)
	load := Load{Total: 10000, Users: 500, Rate: 200}
	topicEnv := map[string]string{
		"KFPIPE_KAFKA_TOPICS_MAIN_REPLICATION_FACTOR":  "3",
		"KFPIPE_KAFKA_TOPICS_MAIN_MIN_INSYNC_REPLICAS": "2",
		"KFPIPE_KAFKA_TOPICS_DLQ_REPLICATION_FACTOR":   "3",
		"KFPIPE_KAFKA_TOPICS_DLQ_MIN_INSYNC_REPLICAS":  "2",
	}
	p := Start(t, Options{Brokers: cl.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 2, Partitions: 6,
		SinkSleep: time.Millisecond, Env: topicEnv})
	Run(t, "broker-loss", p, load, 4*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		// The daemons created the topics: check they did as told.
		for _, topic := range []string{p.MainTopic, p.DLQTopic} {
			rf, isr, err := cl.Replication(ctx, topic)
			if err != nil {
				return err
			}
			if rf != 3 || isr != "2" {
				rec.Problem("%s has replication factor %d, min.insync.replicas %q; want 3 and 2", topic, rf, isr)
			}
		}
		// 1. A follower or leader, whichever node 2 is: kill, resume.
		if !Pause(ctx, 8*time.Second, 10*time.Second) {
			return ctx.Err()
		}
		n2 := cl.Node(2)
		if err := n2.Kill9(); err != nil {
			return err
		}
		if !Pause(ctx, 8*time.Second, 8*time.Second) {
			return ctx.Err()
		}
		t0 := time.Now()
		if err := n2.Resume(); err != nil {
			return err
		}
		rec.Extra("node2_resume", time.Since(t0).Round(100*time.Millisecond))
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		// 2. The broker leading most main-topic partitions.
		leaders, err := cl.Leaders(p.MainTopic)
		if err != nil {
			return err
		}
		count := map[int32]int{}
		for _, l := range leaders {
			if l > 0 {
				count[l]++
			}
		}
		ids := make([]int32, 0, len(count))
		for id := range count {
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return fmt.Errorf("no leader for %s: %v", p.MainTopic, leaders)
		}
		sort.Slice(ids, func(i, j int) bool { return count[ids[i]] > count[ids[j]] })
		hot := ids[0]
		rec.Extra("hot_leader", fmt.Sprintf("node%d(%d/%d)", hot, count[hot], len(leaders)))
		down := time.Now()
		if err := cl.Node(hot).Kill9(); err != nil {
			return err
		}
		// The controller fences the dead broker after its session (6 s)
		// and elects new leaders from the in-sync replicas.
		moved := false
		for time.Since(down) < 30*time.Second && !moved {
			if !Pause(ctx, 500*time.Millisecond, 500*time.Millisecond) {
				return ctx.Err()
			}
			if ls, err := cl.Leaders(p.MainTopic); err == nil {
				moved = true
				for _, l := range ls {
					if l == hot || l < 0 {
						moved = false
					}
				}
			}
		}
		if !moved {
			rec.Problem("leadership did not move off node %d within 30s", hot)
		} else {
			rec.Extra("leaders_moved_after", time.Since(down).Round(100*time.Millisecond))
		}
		if !Pause(ctx, time.Until(down.Add(12*time.Second)), time.Until(down.Add(12*time.Second))) {
			return ctx.Err()
		}
		if err := cl.Node(hot).Resume(); err != nil {
			return err
		}
		return nil
	})
}
