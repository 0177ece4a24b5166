package service

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/console/sources"
	"github.com/kfpipe/kfpipe/internal/history"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// archiveOutcomes turns the consumer's outcome records on (the archive
// configured in its file, as the three daemons share one) on a topic of
// the test's own, deleted at cleanup.
func archiveOutcomes(t *testing.T, pc *place, dsn string, ccfg *config.Consumer, dcfg *config.DLQConsumer) {
	t.Helper()
	topic := pc.mainTopic + "-outcomes"
	ccfg.Archive.DSN, ccfg.Archive.OutcomesTopic = dsn, topic
	dcfg.Archive.DSN, dcfg.Archive.OutcomesTopic = dsn, topic
	dcfg.Archive.GroupID = pc.mainTopic + "-archiver"
	t.Cleanup(func() { _, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{topic}) })
}

// checkArchivedOutcomes: the replies and outcomes of the running
// pipeline's customers are in the archive, once each — the answered
// customer's message handled and its reply sent (with its text), the
// flaky one's dead letter and its recovery, the flooder's messages
// handled or dead-lettered (blocked among them) — History from the
// archive has the bot's reply after the customer's message, and the
// timeline's effects come from the archive when the marks are gone.
func checkArchivedOutcomes(t *testing.T, ctx context.Context, dsn, wk, answered, flaky string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	kinds := func(user string) map[string]int {
		t.Helper()
		out := map[string]int{}
		testenv.Eventually(t, 60*time.Second, func() error {
			rows, err := conn.Query(ctx, `SELECT kind || ':' || reason, count(*) FROM kf_archive WHERE external_userid = $1 GROUP BY 1`, user)
			if err != nil {
				return err
			}
			clear(out)
			for rows.Next() {
				var k string
				var n int
				if err := rows.Scan(&k, &n); err != nil {
					return err
				}
				out[k] = n
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return testenv.Check(out["handled:"]+out["recovered:"] > 0, "%s: no outcome archived yet: %v", user, out)
		})
		return out
	}
	if got := kinds("tl-answered"); got["message:"] != 1 || got["handled:"] != 1 || got["reply:sent"] != 1 || len(got) != 3 {
		t.Errorf("answered customer's archive rows: %v, want one message, one handled, one reply sent", got)
	}
	if got := kinds("tl-flaky"); got["message:"] != 1 || got["dead_letter:downstream_error"] != 1 || got["recovered:"] != 1 ||
		got["reply:sent"] != 1 || got["handled:"] != 0 {
		t.Errorf("recovered customer's archive rows: %v, want message, dead letter, recovered, reply sent", got)
	}
	got := kinds("tl-flooder")
	letters := 0
	for k, n := range got {
		if len(k) > 12 && k[:12] == "dead_letter:" {
			letters += n
		}
	}
	if got["message:"] != 12 || got["handled:"]+letters != 12 || got["handled:"] != got["reply:sent"] || got["dead_letter:user_blocked"] == 0 {
		t.Errorf("flooder's archive rows: %v, want 12 messages each handled (with its reply) or dead-lettered, blocked among them", got)
	}
	var dups int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT msgid, kind, seq FROM kf_archive GROUP BY 1, 2, 3 HAVING count(*) > 1) d`).Scan(&dups); err != nil || dups != 0 {
		t.Errorf("rows archived more than once: %d (%v)", dups, err)
	}

	st, err := archive.Open(ctx, dsn, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// History as a handler of a later message of the customer sees it.
	turns, err := history.Archive(st).Last(ctx, wk, "tl-answered", time.Now().Add(time.Minute), "later", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 2 || turns[0].MsgID != answered || turns[0].Origin != 3 || turns[1].Origin != archive.OriginBot ||
		turns[1].MsgID != answered || turns[1].MsgType != "text" || !json.Valid(turns[1].Content) ||
		string(turns[1].Content) != `{"msgtype":"text","text":{"content":"thanks"}}` {
		t.Errorf("History of tl-answered from the archive: %+v, want the customer's message then the bot's reply", turns)
	}
	// The timeline's effects, the marks knowing nothing (a key prefix of
	// their own): the archive's.
	msgs := []console.MessageRef{{OpenKfID: wk, UpstreamMsgID: answered}, {OpenKfID: wk, UpstreamMsgID: flaky}, {OpenKfID: wk, UpstreamMsgID: "never-sent"}}
	rdb, prefix := testenv.Redis(t)
	cfg := &config.DLQConsumer{}
	cfg.Redis.KeyPrefix = prefix
	fx, err := sources.NewPipeline(cfg, sources.Deps{Redis: rdb, Archive: st}).Effects(ctx, "", msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, false} {
		if got := fx[i].Done == console.DoneYes && len(fx[i].Replies) == 1 && !fx[i].RepliesUnknown; got != want {
			t.Errorf("effects of %s from the archive: %+v, want known %v", msgs[i].UpstreamMsgID, fx[i], want)
		}
	}
}
