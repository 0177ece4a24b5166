package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/dlq/admin"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
)

func adminHandler(cfg *config.DLQConsumer, base *daemon.Base, d *DLQ) (http.Handler, error) {
	ac := admin.FromConfig(cfg.Admin, cfg.Redis.KeyPrefix)
	for g := range cfg.RateLimit.Groups {
		ac.Groups = append(ac.Groups, g)
	}
	for _, r := range dlq.Reasons {
		ac.Reasons = append(ac.Reasons, string(r))
	}
	ac.Pipeline = pipelineView{state: producer.NewRedisState(base.Redis, cfg.Redis.KeyPrefix), kafka: base.Admin,
		topic: cfg.Kafka.Topics.Main.Name, group: cfg.Admin.ConsumerGroup}
	srv, err := admin.New(ac, dlqStore{x: d.Index}, rateLimitAdmin{a: d.Admin}, base.Redis, base.Log, base.Registry)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return srv, nil
}

// dlqStore adapts the DLQ index to the admin API.
type dlqStore struct{ x *dlq.Index }

func toAdminMessage(e *dlq.Entry) admin.DLQMessage {
	m := admin.DLQMessage{ID: e.ID, User: e.UserID, OpenKfID: e.OpenKfID, Reason: string(e.Reason), Details: e.Details,
		State: e.State, FailureTime: e.FailureTime, RetryCount: e.RetryCount + e.Attempts, NextRetryTime: e.NextRetryTime,
		SourceTopic: e.SourceTopic, SourcePartition: e.SourcePartition, SourceOffset: e.SourceOffset,
		Preview: e.Preview, DLQPartition: e.At.Partition, DLQOffset: e.At.Offset}
	switch {
	case !e.Whole:
		// A summary (List): the message is read from the DLQ topic on Get.
	case e.Original != nil:
		m.Message, _ = json.Marshal(e.Original)
	case len(e.OriginalValue) > 0:
		// Undecodable payloads are shown as a JSON string, never lost.
		m.Message, _ = json.Marshal(string(e.OriginalValue))
	}
	return m
}

func toFilter(f admin.DLQFilter) dlq.Filter {
	return dlq.Filter{User: f.User, Reason: f.Reason, Review: f.Review, Cursor: f.Cursor, Limit: f.Limit}
}

func (s dlqStore) Stats(ctx context.Context) (admin.DLQStats, error) {
	st, err := s.x.Stats(ctx)
	return admin.DLQStats{Total: st.Total, ByReason: st.ByReason, Due: st.Due, DueNow: st.DueNow, Review: st.Review, Retried: st.Retried}, err
}

func (s dlqStore) List(ctx context.Context, f admin.DLQFilter) ([]admin.DLQMessage, string, error) {
	entries, next, err := s.x.List(ctx, toFilter(f))
	if errors.Is(err, dlq.ErrBadCursor) {
		return nil, "", fmt.Errorf("%w: %w", admin.ErrBadCursor, err)
	}
	if err != nil {
		return nil, "", err
	}
	out := make([]admin.DLQMessage, len(entries))
	for i, e := range entries {
		out[i] = toAdminMessage(e)
	}
	return out, next, nil
}

func (s dlqStore) Get(ctx context.Context, id string) (admin.DLQMessage, error) {
	e, err := s.x.Get(ctx, id)
	if errors.Is(err, dlq.ErrNotFound) {
		return admin.DLQMessage{}, admin.ErrNotFound
	}
	if err != nil {
		return admin.DLQMessage{}, err
	}
	return toAdminMessage(e), nil
}

// retryable reports why e cannot be retried now, or nil.
func retryable(e *dlq.Entry, now time.Time) error {
	if e.Reason == dlq.ReasonInvalidMessage {
		return fmt.Errorf("%w: invalid_message would fail again", admin.ErrConflict)
	}
	if e.State == "due" && e.NextRetryTime != nil && !e.NextRetryTime.After(now) {
		return fmt.Errorf("%w: already due now", admin.ErrConflict)
	}
	return nil
}

func (s dlqStore) Retry(ctx context.Context, id string) error {
	e, err := s.x.Get(ctx, id)
	if errors.Is(err, dlq.ErrNotFound) {
		return admin.ErrNotFound
	}
	if err != nil {
		return err
	}
	now := time.Now()
	if err := retryable(e, now); err != nil {
		return err
	}
	return s.x.Requeue(ctx, id, now)
}

// BatchRetry requeues every retryable entry the filter selects, up to
// f.Limit entries when it is set.
func (s dlqStore) BatchRetry(ctx context.Context, f admin.DLQFilter) (int, error) {
	now := time.Now()
	var batch []*dlq.Entry
	df := toFilter(f)
	df.Limit = 200
	for {
		entries, next, err := s.x.List(ctx, df)
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			if f.Limit > 0 && len(batch) >= f.Limit {
				break
			}
			if retryable(e, now) == nil {
				batch = append(batch, e)
			}
		}
		if next == "" || (f.Limit > 0 && len(batch) >= f.Limit) {
			break
		}
		df.Cursor = next
	}
	if f.DryRun {
		return len(batch), nil
	}
	// Requeued in their messages' order, so each user's letters go back
	// in the order the user sent them.
	return s.x.RequeueInOrder(ctx, batch, now)
}

// Purge deletes every entry the filter selects; a dry run counts them
// (Limit ignored, as the index's Purge ignores it).
func (s dlqStore) Purge(ctx context.Context, f admin.DLQFilter) (int, error) {
	if !f.DryRun {
		return s.x.Purge(ctx, toFilter(f))
	}
	df := toFilter(f)
	df.Limit = 200
	df.Cursor = ""
	n := 0
	for {
		entries, next, err := s.x.List(ctx, df)
		if err != nil {
			return 0, err
		}
		n += len(entries)
		if next == "" {
			return n, nil
		}
		df.Cursor = next
	}
}

func (s dlqStore) Export(ctx context.Context, f admin.DLQFilter, fn func(admin.DLQMessage) error) error {
	return s.x.Export(ctx, toFilter(f), func(e *dlq.Entry) error { return fn(toAdminMessage(e)) })
}

// rateLimitAdmin adapts ratelimit.Admin to the admin API.
type rateLimitAdmin struct{ a *ratelimit.Admin }

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func mapRLErr(err error) error {
	switch {
	case errors.Is(err, ratelimit.ErrUnknownGroup):
		return fmt.Errorf("%w: %w", admin.ErrUnknownGroup, err)
	case errors.Is(err, ratelimit.ErrNotWhitelisted):
		return fmt.Errorf("%w: %w", admin.ErrConflict, err)
	}
	return err
}

func (r rateLimitAdmin) Status(ctx context.Context, user string) (admin.RateLimitStatus, error) {
	s, err := r.a.Status(ctx, user)
	return admin.RateLimitStatus{User: s.User, Group: s.Group, Blocked: s.Blocked, BlockedUntil: optTime(s.BlockedUntil),
		Permanent: s.Permanent}, mapRLErr(err)
}

func (r rateLimitAdmin) Unblock(ctx context.Context, user string) error {
	return mapRLErr(r.a.Unblock(ctx, user))
}

func (r rateLimitAdmin) Block(ctx context.Context, user string, d time.Duration) error {
	return mapRLErr(r.a.Block(ctx, user, d))
}

func (r rateLimitAdmin) SetGroup(ctx context.Context, user, group string) error {
	return mapRLErr(r.a.SetGroup(ctx, user, group))
}

func (r rateLimitAdmin) Whitelist(ctx context.Context, user string) error {
	return mapRLErr(r.a.Whitelist(ctx, user))
}

func (r rateLimitAdmin) RemoveWhitelist(ctx context.Context, user string) error {
	return mapRLErr(r.a.RemoveWhitelist(ctx, user))
}

func (r rateLimitAdmin) ListBlocked(ctx context.Context, cursor, limit int) ([]admin.BlockedUser, int, error) {
	users, next, err := r.a.ListBlocked(ctx, cursor, limit)
	out := make([]admin.BlockedUser, len(users))
	for i, u := range users {
		out[i] = admin.BlockedUser{User: u.User, BlockedUntil: optTime(u.BlockedUntil), Permanent: u.Permanent}
	}
	return out, next, mapRLErr(err)
}

func (s dlqStore) Inflow(ctx context.Context, to time.Time, step time.Duration, n int) (map[string][]int64, error) {
	return s.x.Inflow(ctx, to, step, n)
}

// pipelineView gives the admin API's overview what kf-producer published
// (the accounts' sync horizon, in Redis) and the schedule-consumers' lag
// (the group's offsets, from Kafka).
type pipelineView struct {
	state *producer.RedisState
	kafka *kafka.AdminClient
	topic string
	group string
}

func (p pipelineView) Accounts(ctx context.Context) ([]admin.AccountSync, error) {
	st, err := p.state.SyncStatuses(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]admin.AccountSync, len(st))
	for i, s := range st {
		a := admin.AccountSync{OpenKfID: s.OpenKfID, Reported: s.Reported}
		if !s.LastSuccess.IsZero() {
			a.LastSuccess = &s.LastSuccess
		}
		if !s.OldestWaiting.IsZero() {
			a.OldestWaiting = &s.OldestWaiting
		}
		out[i] = a
	}
	return out, nil
}

func (p pipelineView) Lag(ctx context.Context) ([]admin.PartitionLag, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lag, err := kafkaclient.GroupLag(ctx, p.kafka, p.topic, p.group)
	if err != nil {
		return nil, err
	}
	out := make([]admin.PartitionLag, len(lag))
	for i, l := range lag {
		out[i] = admin.PartitionLag{Partition: l.Partition, End: l.End, Committed: l.Committed, Lag: l.Lag}
	}
	return out, nil
}
