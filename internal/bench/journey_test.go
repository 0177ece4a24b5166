package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestStateJourneySmall: the bucket journey at three tenths of its length (a jump of 18 slots: the first, written under the old layout, is amortised over fewer slots than in the full journey)
// (issue 43, item 4), with the shipped config/production.yaml: every row
// keeps at most 16 B of marks a message.
func TestStateJourneySmall(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	t.Chdir(testenv.RepoRoot(t))
	e := &Env{Prefix: testenv.Name(t, "bench"), Redis: rdb}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		unlinkPrefix(ctx, rdb, e.Prefix+":*")
	})
	rows, err := e.stateJourney(0.3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Logf("%s: %d msgs, %.2f B a message, %v keys, end buckets %v", r.Scenario, r.Msgs, r.Extra["redis_key_bytes_per_msg"], r.Extra["redis_keys"], r.Extra["end_buckets_by_partition"])
		if !r.Pass {
			t.Errorf("%s keeps %v B a message, want <= 16", r.Scenario, r.Extra["redis_key_bytes_per_msg"])
		}
	}
}
