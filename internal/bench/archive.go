package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
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
	ctx := context.Background()
	schema := strings.ReplaceAll(strings.ToLower(e.Prefix), "-", "_") + "_archive"
	conn, err := pgx.Connect(ctx, o.DSN)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return Result{}, err
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
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
	acfg := config.Archive{GroupID: e.Prefix + "-archiver", BatchSize: 5000, FlushInterval: 200 * time.Millisecond}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0 := CPUTime()
	t0 := time.Now()
	go func() { done <- archive.NewArchiver(kcfg, acfg, st, e.Log, nil).Run(rctx) }()
	var rows int64
	ok := waitUntil(10*time.Minute, func() bool {
		_ = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "kf_archive"}.Sanitize()).Scan(&rows)
		return rows >= int64(o.Msgs)
	})
	took := time.Since(t0)
	cpu := CPUTime() - cpu0
	cancel()
	if err := <-done; err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{}, fmt.Errorf("archive: %d of %d messages archived in 10 min", rows, o.Msgs)
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+pgx.Identifier{schema, "kf_archive"}.Sanitize()); err != nil {
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
	return Result{Scenario: "archive", Msgs: o.Msgs, MsgsPerSec: round(rate, 0),
		P50Ms: round(lat.Quantile(0.5), 2), P99Ms: round(lat.Quantile(0.99), 2),
		Goal: "archive writes >= 5000 msg/s", Pass: rate >= 5000, RSSMiB: round(RSSMiB(), 1),
		Extra: map[string]any{
			"wire_bytes_per_msg":     round(wire, 0),
			"table_bytes_per_msg":    round(float64(table)/float64(o.Msgs), 1),
			"index_bytes_per_msg":    round(float64(indexes)/float64(o.Msgs), 1),
			"disk_bytes_per_msg":     round(float64(table+indexes)/float64(o.Msgs), 1),
			"day_partitions":         parts,
			"users":                  o.Users,
			"archiver_cpu_s_per_10k": round(cpu.Seconds()/float64(o.Msgs)*10000, 3),
			"latency":                "timeline query: a customer over 7 days",
			"query":                  "one customer's conversation over every partition (p50_ms, p99_ms)",
			"queries":                o.Queries,
		}}, nil
}
