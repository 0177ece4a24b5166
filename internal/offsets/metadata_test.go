package offsets

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestFinishedAboveListsFinishedBehindTheHead(t *testing.T) {
	tr := NewTracker(0)
	for off := int64(10); off < 20; off++ {
		tr.Add(off)
	}
	for _, off := range []int64{10, 12, 13, 17, 19} {
		tr.Done(off)
	}
	next, _ := tr.Committable()
	if next != 11 {
		t.Fatalf("committable %d, want 11", next)
	}
	if got, want := tr.FinishedAbove(), []int64{12, 13, 17, 19}; !slices.Equal(got, want) {
		t.Fatalf("FinishedAbove = %v, want %v", got, want)
	}
	meta, truncated := EncodeFinished(next, tr.FinishedAbove(), MaxMetadata)
	if meta != "kfpipe1:1-2,6,8" || truncated {
		t.Fatalf("EncodeFinished = %q, %v", meta, truncated)
	}
	tr.Done(11) // 11, 12, 13 become committable; 17 and 19 stay behind 14
	if next, _ := tr.Committable(); next != 14 {
		t.Fatalf("committable %d, want 14", next)
	}
	if got, want := tr.FinishedAbove(), []int64{17, 19}; !slices.Equal(got, want) {
		t.Fatalf("after the head finished: FinishedAbove = %v, want %v", got, want)
	}
}

func TestFinishedMetadataRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for range 500 {
		next := rng.Int64N(1 << 40)
		var done []int64
		for off := next + 1; off < next+1+rng.Int64N(400); off++ {
			if rng.IntN(3) > 0 {
				done = append(done, off)
			}
		}
		meta, truncated := EncodeFinished(next, done, MaxMetadata)
		if truncated {
			t.Fatalf("%d offsets did not fit in %d bytes: %q", len(done), MaxMetadata, meta)
		}
		got, err := DecodeFinished(next, meta)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, done) {
			t.Fatalf("round trip of %v at %d: %q decoded to %v", done, next, meta, got)
		}
	}
}

func TestFinishedMetadataTruncatesToTheEarliest(t *testing.T) {
	var done []int64
	for off := int64(2); off < 4000; off += 2 { // no two adjacent: one range each
		done = append(done, off)
	}
	meta, truncated := EncodeFinished(0, done, 200)
	if !truncated || len(meta) > 200 {
		t.Fatalf("EncodeFinished = %q (%d bytes), truncated %v; want at most 200 bytes, truncated", meta, len(meta), truncated)
	}
	got, err := DecodeFinished(0, meta)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || !slices.Equal(got, done[:len(got)]) {
		t.Fatalf("truncated metadata decoded to %v, want a prefix of the input", got)
	}
	if meta, truncated := EncodeFinished(0, done, 5); meta != "" || !truncated {
		t.Fatalf("nothing fits: EncodeFinished = %q, %v", meta, truncated)
	}
}

func TestDecodeFinishedForeignAndMalformed(t *testing.T) {
	for _, meta := range []string{"", "reset by ops", "kfpipe1:"} {
		if got, err := DecodeFinished(5, meta); err != nil || got != nil {
			t.Errorf("DecodeFinished(%q) = %v, %v; want nothing, no error", meta, got, err)
		}
	}
	for _, meta := range []string{"kfpipe1:x", "kfpipe1:3,2", "kfpipe1:0", "kfpipe1:4-2", "kfpipe1:1-99999999"} {
		if _, err := DecodeFinished(5, meta); err == nil || !strings.Contains(err.Error(), meta) {
			t.Errorf("DecodeFinished(%q): error %v, want one naming the metadata", meta, err)
		}
	}
}
