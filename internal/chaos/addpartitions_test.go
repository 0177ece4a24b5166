package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// TestChaosAddPartitions: partitions are added to the main topic mid-run
// (4 → 8; the producer and the consumers restarted to read the new count,
// as docs/operations.md's runbook says), messages keep coming under the
// new placement, and then WeChat hands every message out again (the
// producer's cursors deleted: a re-pull of the 3-day window). Most users
// moved, so most copies land in a partition that never held their
// message: each must still be recognised as a duplicate (the state store
// asks the partition the user had under the earlier count) — dup=0.
func TestChaosAddPartitions(t *testing.T) {
	svc := NeedServices(t)
	load := Size(Load{Total: 600, Users: 60, Rate: 200}, Load{Total: 20000, Users: 1000, Rate: 500})
	const before, after = 4, 8
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: Size(1, 2), Partitions: before,
		DedupLease: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := NewFeeder(p, load.Users)
	p.feeder = f
	start := time.Now()
	settle := Size(90*time.Second, 5*time.Minute)
	phase := func(name string) {
		t.Helper()
		if err := f.Feed(ctx, load.Total/2, load.Rate); err != nil {
			t.Fatalf("%s: feed: %v", name, err)
		}
		if err := p.Settle(ctx, f, settle); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	phase("before the partitions were added")

	ac, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": p.Opts.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	res, err := ac.CreatePartitions(ctx, []kafka.PartitionsSpecification{{Topic: p.MainTopic, IncreaseTo: after}})
	ac.Close()
	if err != nil || len(res) != 1 || res[0].Error.Code() != kafka.ErrNoError {
		t.Fatalf("add partitions: %v %v", err, res)
	}
	moved := 0
	for i := range load.Users {
		if u := p.UserName(i); kafkaclient.KeyPartition(u, before) != kafkaclient.KeyPartition(u, after) {
			moved++
		}
	}
	// The runbook: kafka.topics.main.partitions raised, the producer and
	// the consumers restarted, so that the producer places and the group
	// assigns by the new count at once.
	// (A stop's own faults are another scenario's: logged, not judged.)
	for _, d := range append([]*Daemon{p.Producer}, p.Consumers...) {
		if err := d.Stop(30 * time.Second); err != nil {
			t.Logf("stop %s: %v", d.Name, err)
		}
		d.env = append(d.env, fmt.Sprintf("KFPIPE_KAFKA_TOPICS_MAIN_PARTITIONS=%d", after))
		if err := d.Restart(60 * time.Second); err != nil {
			t.Fatalf("restart %s: %v", d.Name, err)
		}
	}
	phase("after the partitions were added")

	// WeChat hands everything out again.
	for _, kf := range p.OpenKfIDs {
		if err := p.rdb.Del(ctx, p.Prefix+"cursor:"+redisconn.Tag(p.rdb, kf)).Err(); err != nil {
			t.Fatal(err)
		}
		f.notify(ctx, kf)
	}
	// Every copy read: the consumers (restarted after the first half)
	// finished the second half and every copy, as a duplicate or, if the
	// store did not know it, as an effect (the evidence's dup).
	sent := len(f.Sent())
	var dups, finished float64
	var records int
	for deadline := time.Now().Add(settle); ; {
		_, records, err = p.DumpMainTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		dups, finished = 0, 0
		for _, c := range p.Consumers {
			v, _ := c.MetricSum(ctx, "kfpipe_messages_duplicate_total")
			dups += v
			v, _ = c.MetricSum(ctx, "kfpipe_messages_processed_total")
			finished += v
		}
		if records >= 2*sent && finished >= float64(sent+sent-load.Total/2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the re-pulled copies were not all read: %d records for %d messages, %.0f finished since the restart", records, sent, finished)
		}
		time.Sleep(time.Second)
	}
	settleErr := p.Settle(ctx, f, settle)
	ev, err := p.Collect(ctx, f)
	if err != nil {
		t.Fatalf("collect evidence: %v", err)
	}
	rep := ev.Report("add-partitions", time.Since(start))
	rep.Extra("partitions", fmt.Sprintf("%d->%d", before, after))
	rep.Extra("users_moved", moved)
	rep.Extra("copies", records-sent)
	rep.Extra("duplicates_recognised", int(dups))
	if moved == 0 {
		rep.Problem("no user moved: the run proves nothing")
	}
	if settleErr != nil {
		rep.note("%v", settleErr)
	}
	for _, e := range p.StopAll(15 * time.Second) {
		rep.Problem("shutdown: %s", e)
	}
	Finish(t, rep)
}
