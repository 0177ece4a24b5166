package config

import (
	"net/url"
	"strings"
	"time"
)

// Archive is the archive section (docs/operations.md, "The conversation
// archive"): every main-topic message and every dead letter kept in
// PostgreSQL, partitioned by day, for the customer timeline at any age up
// to the retention and for handlers' History. The dlq-consumer runs the
// archiver; an empty dsn turns the archive off (the timeline then scans
// the main topic).
type Archive struct {
	// DSN is the PostgreSQL connection string
	// (postgres://user@host:5432/db?sslmode=…); empty: no archive. From
	// the environment when it holds a password (KFPIPE_ARCHIVE_DSN).
	DSN string `mapstructure:"dsn"`
	// Retention is how long rows are kept: day partitions older than it
	// are dropped whole (no row-by-row delete).
	Retention time.Duration `mapstructure:"retention" default:"720h" range:"[24h, 87600h]"`
	// GroupID is the archiver's own consumer group on the main topic and
	// the DLQ topic: its lag is its own, the schedule-consumers never wait
	// for it.
	GroupID string `mapstructure:"group_id" default:"kfpipe-archiver"`
	// BatchSize is how many records one COPY writes at most.
	BatchSize int `mapstructure:"batch_size" default:"5000" range:"[1, 1_000_000]"`
	// FlushInterval is how long a record waits for its batch to fill
	// before the batch is written anyway.
	FlushInterval time.Duration `mapstructure:"flush_interval" default:"200ms" range:"[1ms, 1m]"`
	// OutcomesTopic is the topic the schedule-consumers write each
	// message's outcome and replies to when the archive is on, keyed by
	// user; the archiver reads it beside the main topic and the DLQ topic.
	// Created when missing with the main topic's settings.
	OutcomesTopic string `mapstructure:"outcomes_topic" default:"qywx-chat-outcomes"`
}

// BoundsApply reports whether the section's bounds are checked: only
// when the archive is on.
func (a Archive) BoundsApply() bool { return a.DSN != "" }

// validate checks the keys the tags cannot: a DSN in URL form names a
// postgres scheme and a host, and the group is named.
func (a Archive) validate(v *validator) {
	if a.DSN == "" {
		return
	}
	if strings.Contains(a.DSN, "://") {
		u, err := url.Parse(a.DSN)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
			v.addf("archive.dsn", "must be a postgres://host/db URL or a key=value connection string")
		}
	} else if !strings.Contains(a.DSN, "=") {
		v.addf("archive.dsn", "must be a postgres://host/db URL or a key=value connection string")
	}
	v.nonEmpty("archive.group_id", a.GroupID)
	v.nonEmpty("archive.outcomes_topic", a.OutcomesTopic)
}
