package archive

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The table, its day partitions (kf_archive_pYYYYMMDD) and the
// archiver's progress per partition of the topics it reads.
//
// The primary key leads with msgid: "one message by msgid" is one index
// probe per partition. It must hold the partition key (PostgreSQL's rule
// for unique keys on a partitioned table); at is the send time, the same
// for every copy of a message, so the key is (msgid, kind, seq) in effect.
// (external_userid, at) answers a customer's conversation in a window and
// their last turns; (open_kfid, at) a KF account's recent traffic.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS kf_archive (
	at              timestamptz NOT NULL,
	msgid           text        NOT NULL,
	kind            text        NOT NULL,
	seq             integer     NOT NULL DEFAULT 0,
	open_kfid       text        NOT NULL,
	external_userid text        NOT NULL,
	msg_type        text        NOT NULL DEFAULT '',
	origin          smallint    NOT NULL DEFAULT 0,
	servicer_userid text        NOT NULL DEFAULT '',
	reason          text        NOT NULL DEFAULT '',
	detail          text        NOT NULL DEFAULT '',
	content         bytea,
	src_partition   integer     NOT NULL DEFAULT -1,
	src_offset      bigint      NOT NULL DEFAULT -1,
	recorded        timestamptz NOT NULL,
	PRIMARY KEY (msgid, kind, seq, at)
) PARTITION BY RANGE (at);
CREATE INDEX IF NOT EXISTS kf_archive_user_at ON kf_archive (external_userid, at);
CREATE INDEX IF NOT EXISTS kf_archive_kf_at ON kf_archive (open_kfid, at);
CREATE TABLE IF NOT EXISTS kf_archive_progress (
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	next_offset bigint      NOT NULL,
	record_time timestamptz NOT NULL,
	updated_at  timestamptz NOT NULL,
	PRIMARY KEY (topic, partition)
);`

// migrateLock serialises schema changes between archivers (any 64-bit
// number the project owns).
const migrateLock = 0x6b66_6172_6368_6976

// day is the UTC day holding t.
func day(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

func partitionName(d time.Time) string { return "kf_archive_p" + d.Format("20060102") }

// migrate creates the table and its indexes when missing.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("archive schema: %w", err)
	}
	return tx.Commit(ctx)
}

// ensurePartitions creates the day partitions of days that are missing.
func ensurePartitions(ctx context.Context, conn *pgx.Conn, days []time.Time) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
		return err
	}
	for _, d := range days {
		q := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF kf_archive FOR VALUES FROM ('%s') TO ('%s')",
			partitionName(d), d.Format(time.RFC3339), d.AddDate(0, 0, 1).Format(time.RFC3339))
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("archive partition %s: %w", partitionName(d), err)
		}
	}
	return tx.Commit(ctx)
}

// dropExpired drops the day partitions wholly older than cutoff and
// returns their names.
func dropExpired(ctx context.Context, conn *pgx.Conn, cutoff time.Time) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'kf_archive' AND p.relnamespace = c.relnamespace
		  AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var dropped []string
	for _, n := range names {
		d, err := time.Parse("20060102", strings.TrimPrefix(n, "kf_archive_p"))
		if err != nil || !d.AddDate(0, 0, 1).Before(cutoff) && !d.AddDate(0, 0, 1).Equal(cutoff) {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{n}.Sanitize()); err != nil {
			return dropped, fmt.Errorf("dropping %s: %w", n, err)
		}
		dropped = append(dropped, n)
	}
	return dropped, nil
}
