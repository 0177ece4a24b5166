package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestChaosRedisFull: the scenario's own Redis (maxmemory-policy
// noeviction, as the daemons require) is given a maxmemory just above what
// it uses, mid-run: it fills up, and every write is refused with OOM for a
// while; then maxmemory is raised. Judged: lost=0 dup=0 reordered=0 and no
// dead letter (a full Redis is kfpipe's outage, not the messages' fault):
// the consumers hold their messages and commit nothing they could not
// record, and everything completes after memory is raised. Reported: the
// OOM refusals Redis counted (errorstat_OOM), the memory limit and the
// time Redis was full.
func TestChaosRedisFull(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	svc := NeedServices(t)
	rd := PrivateRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	load := Size(Load{Total: 6000, Users: 300, Rate: 200}, Load{Total: 20000, Users: 1000, Rate: 250})
	full := Size(15*time.Second, 40*time.Second)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: rd.Addr, Kcat: svc.Kcat, Consumers: 2,
		SinkSleep: 2 * time.Millisecond, Judge: func(ev *Evidence, rep *Report) {
			judgeWaits(ev, rep)
			if rep.DLQ > 0 {
				rep.Problem("%d messages dead-lettered while Redis was full: a full Redis is an outage, not a failed message", rep.DLQ)
			}
		}})
	Run(t, "redis-full", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		before := oomErrors(ctx, rdb)
		used, err := usedMemory(ctx, rdb)
		if err != nil {
			return err
		}
		// Room for a second or two of dedup marks, then OOM: ~225 B a
		// message with dedup.store claims (at 200 msg/s, 45 KiB a
		// second; 512 KiB took 11 s of the 15 s window to fill in a CI
		// run, which then saw too few refusals for a consumer to report
		// one), ~10 B with leases.
		headroom := int64(96 << 10)
		if os.Getenv("KFPIPE_DEDUP_STORE") == "leases" {
			headroom = 8 << 10
		}
		limit := used + headroom
		if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(limit, 10)).Err(); err != nil {
			return err
		}
		rec.Extra("maxmemory_kib", limit>>10)
		// While Redis is full, the consumers say so: PING still answers,
		// so readiness alone would not; the /readyz detail and
		// kfpipe_redis_errors_total{kind="oom"} (alert
		// KfpipeRedisOutOfMemory) do.
		told := map[string]bool{}
		deadline := time.Now().Add(full)
		for time.Now().Before(deadline) && len(told) < len(p.Consumers) {
			for _, c := range p.Consumers {
				_, body, err := c.Readyz(ctx)
				n, _ := c.Metric(ctx, `kfpipe_redis_errors_total{kind="oom"}`)
				if err == nil && strings.Contains(body, "out of memory") && n > 0 {
					told[c.Tag()] = true
				}
			}
			if !Pause(ctx, 500*time.Millisecond, 500*time.Millisecond) {
				return ctx.Err()
			}
		}
		rec.Extra("consumers_reporting_oom", len(told))
		if len(told) == 0 {
			rec.Problem("no consumer reported Redis out of memory on /readyz and in kfpipe_redis_errors_total")
		}
		if !Pause(ctx, time.Until(deadline), time.Until(deadline)) {
			return ctx.Err()
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			return err
		}
		oom := oomErrors(ctx, rdb) - before
		rec.Extra("oom_refusals", oom)
		if oom == 0 {
			rec.Problem("Redis never refused a write with OOM: the scenario proved nothing")
		}
		return nil
	})
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, nil
}

// oomErrors is Redis's count of commands refused with OOM.
func oomErrors(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "errorstats").Result()
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "errorstat_OOM:count="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
