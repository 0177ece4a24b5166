package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosArchiveKill9: the conversation archive through an archiver
// killed with SIGKILL (the dlq-consumer it runs in) and a PostgreSQL
// restart, both while messages flow. The database is a server of the
// test's own (scripts/postgres.sh with a data directory and port of its
// own), so the restart never touches a server other tests use. Judged,
// beyond lost=0 dup=0 reordered=0: every message sent is archived exactly
// once (counted by msgid in the archive), so is its outcome (handled or
// recovered) and the reply the sink made for it, and the timeline said
// "archive behind by N" while the archiver caught up after the restart
// (archive_behind_max).
func TestChaosArchiveKill9(t *testing.T) {
	svc := NeedServices(t)
	root := testenv.RepoRoot(t)
	pg := ownPostgres(t, root)
	dsn := pg.dsn
	// At most 5 messages a user: WeChat refuses a 6th reply in a row
	// (95001), and every message is to have its reply.
	load := Size(Load{Total: 1000, Users: 250, Rate: 100, MaxPerUser: 5}, Load{Total: 12000, Users: 3000, Rate: 200, MaxPerUser: 5})
	kills := Size(1, 4)
	behindMax := int64(0)
	suffix := testenv.Short()
	outcomes := "chaos-outcomes-" + suffix
	t.Cleanup(func() { _, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{outcomes}) })
	archiveEnv := func() map[string]string {
		return map[string]string{"KFPIPE_ARCHIVE_DSN": dsn, "KFPIPE_ARCHIVE_OUTCOMES_TOPIC": outcomes,
			"KFPIPE_ARCHIVE_GROUP_ID": "chaos-archiver-" + suffix}
	}
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat, Replies: true,
		ConsumerEnv: archiveEnv(), DLQEnv: archiveEnv(),
		Judge: func(ev *Evidence, rep *Report) {
			rep.Extra("archive_behind_max", behindMax)
			if behindMax == 0 {
				rep.Problem("archive: the timeline never said the archive was behind while it caught up after the restart")
			}
			judgeArchive(dsn, ev, rep)
		}})
	Run(t, "archive-kill9", p, load, Size(2*time.Minute, 5*time.Minute), func(ctx context.Context, p *Pipeline, rec *Report) error {
		for range kills {
			if !Pause(ctx, 3*time.Second, 5*time.Second) {
				return ctx.Err()
			}
			if err := killRestart(p.DLQ); err != nil {
				return err
			}
		}
		if !Pause(ctx, 2*time.Second, 3*time.Second) {
			return ctx.Err()
		}
		// PostgreSQL down for 5 s (fast shutdown: the archiver's
		// connections are cut), then back; the archiver retries.
		if err := pg.run(ctx, "stop"); err != nil {
			return err
		}
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		if err := pg.run(ctx, "resume"); err != nil {
			return err
		}
		// The timeline says how far behind the archive is while it
		// catches up (polled until it has caught up, 20 s at most).
		user := p.UserName(0)
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			n, err := archiveBehind(ctx, p, user)
			if err == nil && n > behindMax {
				behindMax = n
			}
			if err == nil && n == 0 && behindMax > 0 {
				break // caught up
			}
			if !Pause(ctx, 200*time.Millisecond, 200*time.Millisecond) {
				return ctx.Err()
			}
		}
		return nil
	})
}

// archiveBehind reads user's timeline and returns its archive's lag.
func archiveBehind(ctx context.Context, p *Pipeline, user string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AdminURL+"/admin/customers/"+user+"/timeline?window=1h", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var tl struct {
		Archive *struct {
			BehindBy int64 `json:"behind_by"`
		} `json:"archive"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("timeline: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&tl); err != nil || tl.Archive == nil {
		return 0, fmt.Errorf("timeline without the archive: %v", err)
	}
	return tl.Archive.BehindBy, nil
}

// judgeArchive waits (up to 90 s) until every message sent is in the
// archive with its outcome and its reply, then fails the run for any
// msgid archived more than once (a message row, an outcome, a reply) or
// missing.
func judgeArchive(dsn string, ev *Evidence, rep *Report) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ids := make([]string, len(ev.Sent))
	for i, s := range ev.Sent {
		ids[i] = s.MsgID
	}
	var counts map[string]archivedCount // the last read
	complete := func() bool {
		if len(counts) != len(ids) {
			return false
		}
		for _, c := range counts {
			if c.outcomes == 0 || c.replies == 0 {
				return false
			}
		}
		return true
	}
	for {
		got, err := archivedCounts(ctx, dsn, ids)
		if err == nil {
			counts = got
			if complete() {
				break
			}
		}
		select {
		case <-ctx.Done():
			withOutcome, withReply := 0, 0
			for _, c := range counts {
				withOutcome += min(c.outcomes, 1)
				withReply += min(c.replies, 1)
			}
			rep.Problem("archive: after 90 s, of %d messages sent %d archived, %d with their outcome, %d with their reply (%v)",
				len(ids), len(counts), withOutcome, withReply, err)
			return
		case <-time.After(time.Second):
		}
	}
	dups := 0
	for _, c := range counts {
		if c.messages != 1 || c.outcomes != 1 || c.replies != 1 {
			dups++
		}
	}
	rep.Extra("archived", len(counts))
	if dups > 0 {
		rep.Problem("archive: %d message(s) archived, or their outcome or reply, more than once", dups)
	}
}

// archivedCount is what the archive holds about one msgid: its message
// rows, its outcomes (handled or recovered) and its replies sent.
type archivedCount struct{ messages, outcomes, replies int }

func archivedCounts(ctx context.Context, dsn string, ids []string) (map[string]archivedCount, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT msgid, count(*) FILTER (WHERE kind = 'message'),
		count(*) FILTER (WHERE kind IN ('handled', 'recovered')), count(*) FILTER (WHERE kind = 'reply' AND reason = 'sent')
		FROM kf_archive WHERE msgid = ANY($1) GROUP BY msgid`, ids)
	if err != nil {
		return nil, err
	}
	out := map[string]archivedCount{}
	for rows.Next() {
		var id string
		var c archivedCount
		if err := rows.Scan(&id, &c.messages, &c.outcomes, &c.replies); err != nil {
			return nil, err
		}
		if c.messages > 0 {
			out[id] = c
		}
	}
	return out, rows.Err()
}

// testPostgres is a PostgreSQL server of a test's own, started by
// scripts/postgres.sh in a data directory and on a port of its own, and
// stopped (its directory removed) at cleanup.
type testPostgres struct {
	t        *testing.T
	script   string
	dir, dsn string
}

func ownPostgres(t *testing.T, root string) *testPostgres {
	t.Helper()
	// Under the checkout's .run (not the test's temporary directory):
	// the server runs as the postgres user when the tests run as root,
	// and must reach its data directory.
	run := filepath.Join(root, ".run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	pg := &testPostgres{t: t, script: filepath.Join(root, "scripts", "postgres.sh"),
		dir: filepath.Join(run, "postgres-"+testenv.Short())}
	_, port, err := net.SplitHostPort(testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pg.run(ctx, "stop"); err != nil {
			t.Log(err)
		}
		_ = os.RemoveAll(pg.dir)
	})
	if err := pg.run(ctx, "start", "--port", port); err != nil {
		if testenv.InCI() {
			t.Fatalf("a PostgreSQL of the test's own: %v", err)
		}
		t.Skipf("a PostgreSQL of the test's own could not start: %v", err)
	}
	pg.dsn = "postgres://kfpipe@127.0.0.1:" + port + "/kfpipe?sslmode=disable"
	return pg
}

// run runs scripts/postgres.sh with args on the test's own server.
func (pg *testPostgres) run(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, pg.script, args...)
	cmd.Env = append(os.Environ(), "KFPIPE_POSTGRES_DIR="+pg.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres.sh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
