package archive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is the archive in PostgreSQL: the writer's batches and the
// readers' queries. Safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	retention time.Duration
	now       func() time.Time

	mu   sync.Mutex
	days map[time.Time]bool // day partitions known to exist
}

// Progress is how far the archiver has written a partition of a topic.
type Progress struct {
	Topic     string
	Partition int32
	// NextOffset is the first offset not yet archived.
	NextOffset int64
	// RecordTime is the Kafka time of the last record archived.
	RecordTime time.Time
	// UpdatedAt is when the archiver last wrote it.
	UpdatedAt time.Time
}

// Open connects to dsn, creates the schema when missing and returns the
// store; rows are kept for retention.
func Open(ctx context.Context, dsn string, retention time.Duration) (*Store, error) {
	if dsn == "" {
		return nil, ErrOff
	}
	if retention < 24*time.Hour {
		return nil, fmt.Errorf("archive.retention %s is shorter than a day partition", retention)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("archive.dsn: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	s := &Store{pool: pool, retention: retention, now: time.Now, days: map[time.Time]bool{}}
	if err := s.withConn(ctx, func(c *pgx.Conn) error { return migrate(ctx, c) }); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the store's connections.
func (s *Store) Close() { s.pool.Close() }

// Retention is how long rows are kept.
func (s *Store) Retention() time.Duration { return s.retention }

func (s *Store) withConn(ctx context.Context, f func(*pgx.Conn) error) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer c.Release()
	return f(c.Conn())
}

// cutoff is the oldest time still kept.
func (s *Store) cutoff() time.Time { return s.now().Add(-s.retention) }

// columns are kf_archive's columns in the order Write copies them.
var columns = []string{"at", "msgid", "kind", "seq", "open_kfid", "external_userid", "msg_type", "origin",
	"servicer_userid", "reason", "detail", "content", "src_partition", "src_offset", "recorded"}

// Write archives rows and records progress in one transaction: the rows
// are copied (COPY) into a temporary table, then inserted with ON
// CONFLICT DO NOTHING, so writing a row again — a batch retried, records
// re-read after a crash, a message re-pulled — changes nothing. Rows
// older than the retention are left out. It returns how many rows were
// new.
func (s *Store) Write(ctx context.Context, rows []Row, progress []Progress) (int, error) {
	cut := s.cutoff()
	keep := rows[:0:0]
	var missing []time.Time
	s.mu.Lock()
	seen := map[time.Time]bool{}
	for _, r := range rows {
		if r.At.Before(cut) {
			continue
		}
		keep = append(keep, r)
		d := day(r.At)
		if !s.days[d] && !seen[d] {
			seen[d] = true
			missing = append(missing, d)
		}
	}
	s.mu.Unlock()
	var n int
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		if len(missing) > 0 {
			if err := ensurePartitions(ctx, c, missing); err != nil {
				return err
			}
			s.mu.Lock()
			for _, d := range missing {
				s.days[d] = true
			}
			s.mu.Unlock()
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if len(keep) > 0 {
			if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS kf_archive_in
				(LIKE kf_archive INCLUDING DEFAULTS) ON COMMIT DELETE ROWS`); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"kf_archive_in"}, columns, pgx.CopyFromSlice(len(keep), func(i int) ([]any, error) {
				r := keep[i]
				var content []byte
				if len(r.Content) > 0 {
					content = r.Content
				}
				return []any{r.At.UTC(), r.MsgID, r.Kind, int32(r.Seq), r.OpenKfID, r.ExternalUserID, r.MsgType,
					int16(r.Origin), r.ServicerUserID, r.Reason, r.Detail, content, r.Partition, r.Offset, r.Recorded.UTC()}, nil
			})); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			tag, err := tx.Exec(ctx, `INSERT INTO kf_archive SELECT * FROM kf_archive_in ON CONFLICT DO NOTHING`)
			if err != nil {
				return fmt.Errorf("insert: %w", err)
			}
			n = int(tag.RowsAffected())
		}
		now := s.now().UTC()
		for _, p := range progress {
			if _, err := tx.Exec(ctx, `INSERT INTO kf_archive_progress (topic, partition, next_offset, record_time, updated_at)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (topic, partition) DO UPDATE SET
				next_offset = GREATEST(kf_archive_progress.next_offset, EXCLUDED.next_offset),
				record_time = GREATEST(kf_archive_progress.record_time, EXCLUDED.record_time), updated_at = EXCLUDED.updated_at`,
				p.Topic, p.Partition, p.NextOffset, p.RecordTime.UTC(), now); err != nil {
				return fmt.Errorf("progress: %w", err)
			}
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return 0, fmt.Errorf("archive write: %w", err)
	}
	return n, nil
}

// DropExpired drops the day partitions older than the retention and
// returns their names.
func (s *Store) DropExpired(ctx context.Context) ([]string, error) {
	var dropped []string
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var err error
		dropped, err = dropExpired(ctx, c, day(s.cutoff()))
		return err
	})
	s.mu.Lock()
	for _, n := range dropped {
		for d := range s.days {
			if partitionName(d) == n {
				delete(s.days, d)
			}
		}
	}
	s.mu.Unlock()
	return dropped, err
}

const selectRows = `SELECT at, msgid, kind, seq, open_kfid, external_userid, msg_type, origin, servicer_userid,
	reason, detail, content, src_partition, src_offset, recorded FROM kf_archive `

func scanRows(rows pgx.Rows) ([]Row, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		var seq int32
		var origin int16
		var content []byte
		err := r.Scan(&x.At, &x.MsgID, &x.Kind, &seq, &x.OpenKfID, &x.ExternalUserID, &x.MsgType, &origin,
			&x.ServicerUserID, &x.Reason, &x.Detail, &content, &x.Partition, &x.Offset, &x.Recorded)
		x.Seq, x.Origin, x.Content = int(seq), int(origin), content
		x.At, x.Recorded = x.At.UTC(), x.Recorded.UTC()
		return x, err
	})
}

func (s *Store) query(ctx context.Context, q string, args ...any) ([]Row, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	return out, nil
}

// Conversation returns the user's rows sent in [from, to), oldest first,
// at most limit; more says the window held more.
func (s *Store) Conversation(ctx context.Context, user string, from, to time.Time, limit int) (rows []Row, more bool, err error) {
	rows, err = s.query(ctx, selectRows+`WHERE external_userid = $1 AND at >= $2 AND at < $3
		ORDER BY at DESC, recorded DESC, kind, seq LIMIT $4`, user, from.UTC(), to.UTC(), limit+1)
	if err != nil {
		return nil, false, err
	}
	if len(rows) > limit {
		rows, more = rows[:limit], true
	}
	reverse(rows)
	return rows, more, nil
}

// Message returns the rows about one upstream msgid (the message and its
// dead letters), oldest first.
func (s *Store) Message(ctx context.Context, msgid string) ([]Row, error) {
	return s.query(ctx, selectRows+`WHERE msgid = $1 AND at >= $2 ORDER BY kind <> 'message', recorded, seq`, msgid, s.cutoff().UTC())
}

// Account returns a KF account's newest messages sent since since, newest
// first, at most limit.
func (s *Store) Account(ctx context.Context, openKfID string, since time.Time, limit int) ([]Row, error) {
	return s.query(ctx, selectRows+`WHERE open_kfid = $1 AND at >= $2 AND kind = 'message'
		ORDER BY at DESC, recorded DESC LIMIT $3`, openKfID, since.UTC(), limit)
}

// LastTurns returns the last n turns of user's conversation on the KF
// account openKfID — messages (customer, servicer and events) and the
// bot's replies the customer got — about messages sent at or before
// before, leaving out the message exclude and its replies, oldest first.
// A reply sorts after the message it answers (it is kept at that
// message's send time, and recorded later).
func (s *Store) LastTurns(ctx context.Context, openKfID, user string, before time.Time, exclude string, n int) ([]Row, error) {
	rows, err := s.query(ctx, selectRows+`WHERE external_userid = $1 AND open_kfid = $2
		AND (kind = 'message' OR (kind = 'reply' AND reason = 'sent'))
		AND at >= $3 AND at <= $4 AND msgid <> $5
		ORDER BY at DESC, recorded DESC, kind DESC, seq DESC, src_offset DESC LIMIT $6`, user, openKfID, s.cutoff().UTC(), before.UTC(), exclude, n)
	reverse(rows)
	return rows, err
}

// Outcomes returns the outcome and reply rows (KindHandled,
// KindRecovered, KindReply) about the messages msgids, in the order they
// were recorded.
func (s *Store) Outcomes(ctx context.Context, msgids []string) ([]Row, error) {
	if len(msgids) == 0 {
		return nil, nil
	}
	return s.query(ctx, selectRows+`WHERE msgid = ANY($1) AND kind IN ('handled', 'recovered', 'reply') AND at >= $2
		ORDER BY recorded, kind, seq`, msgids, s.cutoff().UTC())
}

// Progress returns how far the archiver has written each partition of
// topic.
func (s *Store) Progress(ctx context.Context, topic string) ([]Progress, error) {
	rows, err := s.pool.Query(ctx, `SELECT topic, partition, next_offset, record_time, updated_at
		FROM kf_archive_progress WHERE topic = $1 ORDER BY partition`, topic)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Progress, error) {
		var p Progress
		err := r.Scan(&p.Topic, &p.Partition, &p.NextOffset, &p.RecordTime, &p.UpdatedAt)
		return p, err
	})
}

// Count returns how many rows of kind are archived for msgid (tests and
// checks: exactly one message row per msgid).
func (s *Store) Count(ctx context.Context, msgid, kind string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM kf_archive WHERE msgid = $1 AND kind = $2`, msgid, kind).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

func reverse(rows []Row) {
	for i, j := 0, len(rows)-1; i < j; i, j = i+1, j-1 {
		rows[i], rows[j] = rows[j], rows[i]
	}
}
