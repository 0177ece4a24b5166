package kfpipe_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/archive"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestHistoryFromArchive: a consumer built with NewConsumer and
// archive.dsn serves kfpipe.History from the conversation archive the
// archiver fills: the handler of a customer's second message reads the
// first and a human servicer's message between them, in order, and not
// the message it is handling.
func TestHistoryFromArchive(t *testing.T) {
	const kfID = "wk-history"
	e := newE2E(t, kfID)
	dsn := testenv.Postgres(t)
	cfg := e.config(t)
	cfg.Archive.DSN = dsn
	// The consumer's outcome records (on with archive.dsn) on a topic of
	// the test's own.
	cfg.Archive.OutcomesTopic = testenv.Name(t, "outcomes")
	t.Cleanup(func() {
		_, _ = testenv.Admin(t).DeleteTopics(context.Background(), []string{cfg.Archive.OutcomesTopic})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	st, err := archive.Open(ctx, dsn, cfg.Archive.Retention)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	actx, stopArchiver := context.WithCancel(ctx)
	archived := make(chan error, 1)
	go func() {
		archived <- archive.NewArchiver(cfg.Kafka, config.Archive{GroupID: testenv.Name(t, "archiver"), BatchSize: 100,
			FlushInterval: 20 * time.Millisecond}, st, nil, nil).Run(actx)
	}()
	defer func() { stopArchiver(); <-archived }()

	var mu sync.Mutex
	seen := map[string]string{} // customer's text -> the history it was given
	bot := kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		if !m.FromCustomer() {
			return nil
		}
		turns, err := kfpipe.History(ctx, m, 10)
		if err != nil {
			return err
		}
		var parts []string
		for _, tn := range turns {
			text, _ := tn.Text()
			parts = append(parts, tn.Servicer+":"+text)
		}
		text, _ := m.Text()
		mu.Lock()
		seen[text] = strings.Join(parts, "|")
		mu.Unlock()
		return nil
	})
	c, err := kfpipe.NewConsumer(cfg, bot)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// step adds a message, produces it and waits until it is archived.
	step := func(add func() string) {
		t.Helper()
		id := add()
		e.produce(t)
		testenv.Eventually(t, 30*time.Second, func() error {
			n, err := st.Count(ctx, id, archive.KindMessage)
			return testenv.Check(err == nil && n == 1, "message %s archived %d times (%v)", id, n, err)
		})
	}
	step(func() string { return e.fake.AddText(kfID, "h1", "where is my parcel") })
	// Handled before the servicer answers: a turn of the same second is
	// "at or before" the message, so a first message handled late (a
	// loaded machine) would see the servicer's answer in its History.
	testenv.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		_, ok := seen["where is my parcel"]
		return testenv.Check(ok, "the first message not handled yet")
	})
	step(func() string { return e.fake.AddServicerText(kfID, "h1", "alice", "it left today") })
	// The same second as the servicer's message at the latest: History
	// takes turns sent at or before the message.
	step(func() string { return e.fake.AddText(kfID, "h1", "thanks") })
	testenv.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		return testenv.Check(seen["thanks"] == ":where is my parcel|alice:it left today" && seen["where is my parcel"] == "",
			"histories seen: %q", seen)
	})
}
