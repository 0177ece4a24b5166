package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/producer"
)

// ArchiveOptions sizes the archive scenario.
type ArchiveOptions struct {
	// DSN is the PostgreSQL the archive is written to (a schema of the
	// run's own, dropped at the end).
	DSN         string
	Msgs, Users int
	Partitions  int
	// Days spreads the messages' send times over this many day
	// partitions.
	Days int
	// Queries is how many timeline queries are timed.
	Queries int
	// Bulk is how many rows are put in the archive before the archiver
	// runs, by the server itself (INSERT … SELECT generate_series) in the
	// shape of the archiver's rows, spread over the same Days: the table
	// the archiver's writes and the timeline's queries are measured on.
	// Filling 20M rows through Kafka and the archiver would take hours.
	Bulk int
	// Beside runs the schedule-consumer's full pipeline (a counting
	// handler) over the same topic while the archiver writes: the
	// archiver's rate is measured beside the consumer, as it runs in a
	// deployment (its own group, the same records).
	Beside bool
}

// bulkFill inserts n rows shaped like the archiver's (msgid, customer
// among users, a text message's item as content, send times spread
// evenly from start over days) into the archive of dsn, one statement a
// day partition, and returns how long it took.
func bulkFill(ctx context.Context, st *archive.Store, conn *pgx.Conn, table, tag string, n, users, days int, start time.Time) (time.Duration, error) {
	t0 := time.Now()
	// One row a day creates the day partitions (the store's own way).
	seed := make([]archive.Row, 0, days+1)
	for d := 0; d <= days; d++ {
		at := start.Add(time.Duration(d) * 24 * time.Hour)
		if at.After(time.Now()) {
			at = time.Now()
		}
		seed = append(seed, archive.Row{At: at, MsgID: fmt.Sprintf("%s-seed-%d", tag, d), Kind: archive.KindMessage,
			OpenKfID: "wkBench", ExternalUserID: UserName(0), MsgType: "text", Origin: 3, Recorded: at})
	}
	if _, err := st.Write(ctx, seed, nil); err != nil {
		return 0, err
	}
	// Up to an hour before the archiver's messages end (now): no row in
	// a day partition not created above.
	span := time.Duration(days)*24*time.Hour - 2*time.Hour
	// The two secondary indexes are built after the fill, as a restore
	// would (sorted, not row by row), then are the schema's again for
	// the archiver's writes and the queries measured on top.
	schema := strings.SplitN(table, ".", 2)[0]
	if _, err := conn.Exec(ctx, "DROP INDEX "+schema+".kf_archive_user_at, "+schema+".kf_archive_kf_at"); err != nil {
		return 0, fmt.Errorf("bulk fill: %w", err)
	}
	const chunk = 1_000_000
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		q := `INSERT INTO ` + table + ` (at, msgid, kind, seq, open_kfid, external_userid, msg_type, origin,
			servicer_userid, reason, detail, content, src_partition, src_offset, recorded)
		SELECT $1::timestamptz + make_interval(secs => g * $2::float8), m, 'message', 0, 'wkBench',
			'wmUser' || lpad((g % $3)::text, 7, '0'), 'text', 3, '', '', '',
			convert_to('{"msgid":"' || m || '","send_time":1700000000,"origin":3,"msgtype":"text","text":{"content":"xxxxxxxxxxxxxx"}}', 'UTF8'),
			g % 12, g / 12, $1::timestamptz + make_interval(secs => g * $2::float8 + 1)
		FROM generate_series($4::bigint, $5::bigint - 1) g, LATERAL (SELECT $6 || '-b-' || lpad(g::text, 10, '0') AS m) x`
		if _, err := conn.Exec(ctx, q, start, span.Seconds()/float64(n), users, lo, hi, tag); err != nil {
			return 0, fmt.Errorf("bulk fill: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '256MB'`); err != nil {
		return 0, err
	}
	for _, q := range []string{"CREATE INDEX kf_archive_user_at ON " + table + " (external_userid, at)",
		"CREATE INDEX kf_archive_kf_at ON " + table + " (open_kfid, at)"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("bulk fill: %w", err)
		}
	}
	return time.Since(t0), nil
}

// Archive measures the conversation archive: the archiver (its own group)
// reading a main topic pre-filled with Msgs messages spread over Days day
// partitions, writing them with COPY; then the bytes a message takes on
// disk (table and indexes) and the timeline's query (one customer's
// conversation over the whole span) p50/p99.
func Archive(e *Env, o ArchiveOptions) (Result, error) {
	if o.DSN == "" {
		return Result{}, fmt.Errorf("archive scenario: -archive-dsn (or KFPIPE_TEST_POSTGRES) is empty")
	}
	// A run stopped (make bench's time limit sends SIGTERM, Ctrl-C)
	// still drops its schema: its ~9 GB must not stay behind.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	schema := strings.ReplaceAll(strings.ToLower(e.Prefix), "-", "_") + "_archive"
	conn, err := pgx.Connect(ctx, o.DSN)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return Result{}, err
	}
	defer func() {
		// On a connection of its own: a query cancelled by a signal
		// closes the run's.
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := pgx.Connect(dctx, o.DSN)
		if err != nil {
			e.Log.Sugar().Errorf("archive: schema %s not dropped: %v", schema, err)
			return
		}
		defer c.Close(dctx)
		if _, err := c.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			e.Log.Sugar().Errorf("archive: schema %s not dropped: %v", schema, err)
		}
	}()
	sep := "?"
	if strings.Contains(o.DSN, "?") {
		sep = "&"
	}
	dsn := o.DSN + sep + "search_path=" + schema

	topic, err := e.Topic("archive", o.Partitions)
	if err != nil {
		return Result{}, err
	}
	kcfg, err := e.KafkaConfig(topic, topic+"-dlq", e.Prefix+"-unused")
	if err != nil {
		return Result{}, err
	}
	dlqTopic, err := e.Topic("archive-dlq", 1)
	if err != nil {
		return Result{}, err
	}
	kcfg.Topics.DLQ.Name = dlqTopic
	kp, err := producer.NewKafkaProducer(kcfg, nil, e.Log)
	if err != nil {
		return Result{}, err
	}
	// Send times: the last Days days, evenly.
	start := time.Now().Add(-time.Duration(o.Days) * 24 * time.Hour).Add(time.Hour)
	step := time.Duration(o.Days) * 24 * time.Hour / time.Duration(o.Msgs)
	pad := strings.Repeat("x", 14)
	const page = 5000
	var wire float64
	for i := 0; i < o.Msgs; i += page {
		batch := make([]*chatmsg.ChatMessage, 0, page)
		for j := i; j < min(i+page, o.Msgs); j++ {
			m := Message(e.Prefix+"-a", j, UserName(j%o.Users), pad)
			m.SendTime = start.Add(time.Duration(j) * step).Unix()
			batch = append(batch, m)
		}
		if i == 0 {
			wire = WireSize(batch)
		}
		if err := kp.ProduceBatch(ctx, topic, batch); err != nil {
			_ = kp.Close(ctx)
			return Result{}, err
		}
	}
	_ = kp.Close(ctx)

	st, err := archive.Open(ctx, dsn, 30*24*time.Hour)
	if err != nil {
		return Result{}, err
	}
	defer st.Close()
	tableName := pgx.Identifier{schema, "kf_archive"}.Sanitize()
	var filled time.Duration
	if o.Bulk > 0 {
		if filled, err = bulkFill(ctx, st, conn, tableName, e.Prefix, o.Bulk, o.Users, o.Days, start); err != nil {
			return Result{}, err
		}
	}
	var before int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+tableName).Scan(&before); err != nil {
		return Result{}, err
	}
	acfg := config.Archive{GroupID: e.Prefix + "-archiver", BatchSize: 5000, FlushInterval: 200 * time.Millisecond}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0 := CPUTime()
	t0 := time.Now()
	var beside *counter
	var besideTook time.Duration
	if o.Beside {
		beside = &counter{target: int64(o.Msgs)}
		sc, _, err := e.startConsumer("archive-consumer", topic, beside, nil)
		if err != nil {
			cancel()
			return Result{}, err
		}
		defer func() { _ = sc.Close(context.Background()) }()
	}
	go func() { done <- archive.NewArchiver(kcfg, acfg, st, e.Log, nil).Run(rctx) }()
	var rows int64
	// Progress, not count(*): counting 20M rows every poll would load
	// the server the archiver writes to.
	ok := waitUntil(10*time.Minute, func() bool {
		_ = conn.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM "+pgx.Identifier{schema, "kf_archive_progress"}.Sanitize()+
			" WHERE topic = $1", topic).Scan(&rows)
		return rows >= int64(o.Msgs) || ctx.Err() != nil
	})
	if ctx.Err() != nil {
		cancel()
		<-done
		return Result{}, fmt.Errorf("archive: stopped: %w", ctx.Err())
	}
	took := time.Since(t0)
	cpu := CPUTime() - cpu0
	cancel()
	if beside != nil {
		if !waitUntil(10*time.Minute, func() bool { return beside.n.Load() >= int64(o.Msgs) }) {
			return Result{}, fmt.Errorf("archive: the consumer beside handled %d of %d", beside.n.Load(), o.Msgs)
		}
		besideTook = time.Unix(0, beside.lastAt.Load()).Sub(t0)
	}
	if err := <-done; err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{}, fmt.Errorf("archive: %d of %d messages archived in 10 min", rows, o.Msgs)
	}
	var total int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+tableName).Scan(&total); err != nil {
		return Result{}, err
	}
	if total-before != int64(o.Msgs) {
		return Result{}, fmt.Errorf("archive: %d rows added for %d messages", total-before, o.Msgs)
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+tableName); err != nil {
		return Result{}, err
	}
	var table, indexes int64
	var parts int
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pg_table_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0), count(*)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r'`, schema).Scan(&table, &indexes, &parts); err != nil {
		return Result{}, err
	}
	// The timeline's query: a random customer's conversation over the
	// whole span.
	var lat Latencies
	r := rand.New(rand.NewPCG(1, 2))
	for range o.Queries {
		u := UserName(r.IntN(o.Users))
		q0 := time.Now()
		got, _, err := st.Conversation(ctx, u, start.Add(-time.Hour), time.Now().Add(time.Hour), 20000)
		if err != nil {
			return Result{}, err
		}
		if len(got) == 0 {
			return Result{}, fmt.Errorf("archive: no conversation for %s", u)
		}
		lat.Add(float64(time.Since(q0).Microseconds()) / 1000)
	}
	rate := float64(o.Msgs) / took.Seconds()
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+tableName+` WHERE at >= $1`, start.Add(-time.Hour)).Scan(&total); err != nil {
		return Result{}, err
	}
	return Result{Scenario: "archive", Msgs: o.Msgs, MsgsPerSec: round(rate, 0),
		P50Ms: round(lat.Quantile(0.5), 2), P99Ms: round(lat.Quantile(0.99), 2),
		Goal: "archive writes >= 5000 msg/s", Pass: rate >= 5000, RSSMiB: round(RSSMiB(), 1),
		Extra: map[string]any{
			"wire_bytes_per_msg":  round(wire, 0),
			"table_bytes_per_msg": round(float64(table)/float64(total), 1),
			"index_bytes_per_msg": round(float64(indexes)/float64(total), 1),
			"disk_bytes_per_msg":  round(float64(table+indexes)/float64(total), 1),
			"disk_gib":            round(float64(table+indexes)/(1<<30), 2),
			"rows":                total,
			"bulk_rows":           o.Bulk,
			"bulk_fill_s":         round(filled.Seconds(), 1),
			"archiver_msgs":       o.Msgs,
			"day_partitions":      parts,
			"users":               o.Users,
			// With the consumer beside, the process's CPU is both's.
			"process_cpu_s_per_10k": round(cpu.Seconds()/float64(o.Msgs)*10000, 3),
			"beside_consumer":       o.Beside,
			"consumer_msgs_per_s":   besideRate(o.Msgs, besideTook),
			"latency":               fmt.Sprintf("timeline query: a customer over %d days", o.Days),
			"query":                 "one customer's conversation over every partition (p50_ms, p99_ms)",
			"queries":               o.Queries,
		}}, nil
}

// besideRate is the rate of the consumer that ran beside the archiver (0
// when none did).
func besideRate(n int, took time.Duration) float64 {
	if took <= 0 {
		return 0
	}
	return round(float64(n)/took.Seconds(), 0)
}
