package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosArchiveKill9: the conversation archive through an archiver
// killed with SIGKILL (the dlq-consumer it runs in) and a PostgreSQL
// restart, both while messages flow. Judged, beyond lost=0 dup=0
// reordered=0: every message sent is archived exactly once (counted by
// msgid in the archive), and the timeline said "archive behind by N"
// while the archiver caught up after the restart (archive_behind_max).
func TestChaosArchiveKill9(t *testing.T) {
	svc := NeedServices(t)
	dsn := testenv.Postgres(t)
	root := testenv.RepoRoot(t)
	load := Size(Load{Total: 1000, Users: 100, Rate: 100}, Load{Total: 12000, Users: 600, Rate: 200})
	kills := Size(1, 4)
	behindMax := int64(0)
	p := Start(t, Options{Brokers: svc.Brokers, Redis: svc.Redis, Kcat: svc.Kcat,
		DLQEnv: map[string]string{"KFPIPE_ARCHIVE_DSN": dsn},
		Judge: func(ev *Evidence, rep *Report) {
			rep.Extra("archive_behind_max", behindMax)
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
		pg := filepath.Join(root, "scripts", "postgres.sh")
		if out, err := exec.CommandContext(ctx, pg, "stop").CombinedOutput(); err != nil {
			return fmt.Errorf("postgres stop: %v: %s", err, out)
		}
		if !Pause(ctx, 5*time.Second, 5*time.Second) {
			return ctx.Err()
		}
		if out, err := exec.CommandContext(ctx, pg, "resume").CombinedOutput(); err != nil {
			return fmt.Errorf("postgres resume: %v: %s", err, out)
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

// judgeArchive waits (up to a minute) until every message sent is in the
// archive, then fails the run for any msgid archived more than once or
// missing.
func judgeArchive(dsn string, ev *Evidence, rep *Report) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ids := make([]string, len(ev.Sent))
	for i, s := range ev.Sent {
		ids[i] = s.MsgID
	}
	var counts map[string]int
	for {
		var err error
		counts, err = archivedCounts(ctx, dsn, ids)
		if err == nil && len(counts) == len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			rep.Problem("archive: %d of %d messages archived after a minute (%v)", len(counts), len(ids), err)
			return
		case <-time.After(time.Second):
		}
	}
	dups := 0
	for _, n := range counts {
		if n != 1 {
			dups++
		}
	}
	rep.Extra("archived", len(counts))
	if dups > 0 {
		rep.Problem("archive: %d message(s) archived more than once", dups)
	}
}

func archivedCounts(ctx context.Context, dsn string, ids []string) (map[string]int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT msgid, count(*) FROM kf_archive WHERE kind = 'message' AND msgid = ANY($1) GROUP BY msgid`, ids)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}
