package dlq

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// BenchmarkIndex measures one dead letter indexed (one Lua script) on the
// test Redis, one request at a time.
func BenchmarkIndex(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	idx := NewIndex(rdb, prefix, WithLetters(mem))
	pol := NewPolicy(testRecovery())
	ctx := context.Background()
	now := time.Now()
	dls := make([]*chatmsg.DeadLetter, b.N)
	for i := range dls {
		dls[i] = deadLetter("bench", ReasonDownstreamError, int64(i), now)
		pol.Place(ctx, dls[i])
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := indexDL(b, ctx, idx, dls[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode measures the wire encoding of a dead letter.
func BenchmarkEncode(b *testing.B) {
	dl := deadLetter("bench", ReasonDownstreamError, 1, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(dl); err != nil {
			b.Fatal(err)
		}
	}
}
