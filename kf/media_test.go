package kf_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestGetMediaInRanges: a file over 20 MB comes in 20 MB ranges, and a
// transfer that breaks off mid-range is resumed from the byte where it
// stopped, not from the start.
func TestGetMediaInRanges(t *testing.T) {
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk1"}})
	defer fake.Close()
	c, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	const size = kf.MediaRangeBytes + 3<<20 + 17 // 23 MB and a bit
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.N(256))
	}
	_, id := fake.AddMedia("wk1", "u1", "video", "big.mp4", "video/mp4", data)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read := func() {
		t.Helper()
		m, err := c.GetMedia(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(m.Body)
		m.Body.Close()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if m.Size != size || m.ContentType != "video/mp4" || m.FileName != "big.mp4" {
			t.Fatalf("size %d, type %q, name %q; want %d, video/mp4, big.mp4", m.Size, m.ContentType, m.FileName, size)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, not the %d served (first difference at %d)", len(got), size, firstDiff(got, data))
		}
	}
	read()
	// The first range breaks off after 5 MB, its resumption after 1,000
	// more bytes; each is asked again from the first byte not read.
	fake.CutNextMediaBodies(5<<20, 1000)
	read()
	want := []string{
		"bytes=0-20971519", "bytes=20971520-41943039", // two ranges
		"bytes=0-20971519", "bytes=5242880-26214399", "bytes=5243880-26215399", // resumed twice
	}
	if got := fake.MediaRanges(); !reflect.DeepEqual(got, want) {
		t.Fatalf("ranges asked %q, want %q", got, want)
	}
}

// TestGetMediaGivesUp: a transfer that keeps breaking off without
// progress ends in an error, not a short file.
func TestGetMediaGivesUp(t *testing.T) {
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk1"}})
	defer fake.Close()
	c, _ := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret(), MediaRange: 100})
	_, id := fake.AddMedia("wk1", "u1", "file", "a.bin", "application/octet-stream", make([]byte, 1000))
	fake.CutNextMediaBodies(10, 0, 0, 0, 0)
	m, err := c.GetMedia(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(m.Body)
	if err == nil {
		t.Fatalf("read %d bytes without an error, want the transfer's failure", len(got))
	}
	if len(got) != 10 {
		t.Fatalf("read %d bytes before the error, want the 10 served", len(got))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
