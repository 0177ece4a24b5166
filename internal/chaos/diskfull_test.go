package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosDiskFull: the DLQ topic refuses the consumer's dead letters
// (its max.message.bytes cut to 64 bytes: every letter is too large) and
// the emergency file's filesystem — a 1 MiB tmpfs the test mounts — is
// full, while a rate-limited bot makes dead letters. Judged: lost=0 dup=0
// reordered=0 — the consumer committed no refused message it could not
// record — and, during the fault, the consumer said so: its /readyz has a
// dead_letters detail and kfpipe_dlq_unrecorded_total counts (alert
// KfpipeDeadLettersNotRecorded). When the topic and the disk are back,
// every letter is recorded and indexed.
func TestChaosDiskFull(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	svc := NeedServices(t)
	dir := testenv.Tmpfs(t, "1m")
	load := Size(Load{Total: 3000, Users: 300, Rate: 100, BotPerMin: 600}, Load{Total: 12000, Users: 1000, Rate: 100, BotPerMin: 600})
	hold := Size(15*time.Second, 60*time.Second)
	limited := map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": "normal"}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Consumers: 1, SinkSleep: time.Millisecond,
		ConsumerEnv: map[string]string{"KFPIPE_RATE_LIMIT_DEFAULT_GROUP": "normal",
			"KFPIPE_DLQ_EMERGENCY_FILE": filepath.Join(dir, "consumer-dlq-emergency.jsonl")},
		DLQEnv: limited})
	admin := testenv.Admin(t)
	Run(t, "disk-full", p, load, 3*time.Minute, func(ctx context.Context, p *Pipeline, rec *Report) error {
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		filler, err := testenv.FillDisk(dir)
		if err != nil {
			return err
		}
		if err := setTopicConfig(ctx, admin, p.DLQTopic, "max.message.bytes", "64"); err != nil {
			return err
		}
		start := time.Now()
		c := p.Consumers[0]
		var told time.Duration
		peakWaiting, peakPaused := 0.0, 0.0
		for time.Since(start) < hold || told == 0 && time.Since(start) < hold+30*time.Second {
			_, body, err := c.Readyz(ctx)
			n, _ := c.Metric(ctx, "kfpipe_dlq_unrecorded_total")
			if told == 0 && err == nil && strings.Contains(body, "not recorded") && n > 0 {
				told = time.Since(start)
			}
			w, _ := c.MetricSum(ctx, "kfpipe_dead_letters_waiting")
			pp, _ := c.Metric(ctx, "kfpipe_partitions_paused_dead_letters")
			peakWaiting, peakPaused = max(peakWaiting, w), max(peakPaused, pp)
			if !Pause(ctx, 500*time.Millisecond, 500*time.Millisecond) {
				return ctx.Err()
			}
		}
		unrecorded, _ := c.Metric(ctx, "kfpipe_dlq_unrecorded_total")
		rec.Extra("full", hold)
		rec.Extra("told_after", told.Round(time.Second))
		rec.Extra("unrecorded_refusals", unrecorded)
		rec.Extra("peak_dead_letters_waiting", peakWaiting)
		rec.Extra("peak_partitions_paused", peakPaused)
		if told == 0 {
			rec.Problem("the consumer never said on /readyz and in kfpipe_dlq_unrecorded_total that dead letters were recorded nowhere")
		}
		// The topic first: freed space would otherwise fill again with
		// the letters still refused by the topic. The emergency file must
		// cope with that too (TestEmergencyReplayOnFullDisk).
		if err := setTopicConfig(ctx, admin, p.DLQTopic, "max.message.bytes", ""); err != nil {
			return err
		}
		return os.Remove(filler)
	})
}

// setTopicConfig sets (value non-empty) or resets to the broker's
// default (empty) one topic setting.
func setTopicConfig(ctx context.Context, admin *kafka.AdminClient, topic, name, value string) error {
	op := kafka.AlterConfigOpTypeSet
	if value == "" {
		op = kafka.AlterConfigOpTypeDelete
	}
	res, err := admin.IncrementalAlterConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: topic,
		Config: []kafka.ConfigEntry{{Name: name, Value: value, IncrementalOperation: op}}}})
	if err != nil {
		return fmt.Errorf("alter %s %s: %w", topic, name, err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("alter %s %s: %v", topic, name, r.Error)
		}
	}
	return nil
}
