package once

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestDoneReadsMarkersOnly: Done is true for a key whose call finished,
// false for one never called, one whose call failed (released) and one
// being processed right now — across more keys than one MGET takes.
func TestDoneReadsMarkersOnly(t *testing.T) {
	f := newFixture(t, mode{}, nil)
	ctx := ctxT(t, 20*time.Second)
	var keys []string
	var want []bool
	for i := range 1500 {
		k := "done-" + strconv.Itoa(i)
		keys = append(keys, k)
		done := i%3 == 0
		want = append(want, done)
		if done {
			if err := f.c.Do(ctx, k, time.Hour, func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.c.Do(ctx, "done-1", time.Hour, func(context.Context) error { return errors.New("fails") }); err == nil {
		t.Fatal("a failing call reported no error")
	}
	running, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = f.c.Do(context.Background(), "done-2", time.Hour, func(context.Context) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	got, err := Done(ctx, f.rdb, f.prefix, keys)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		n := 0
		for i := range got {
			if got[i] != want[i] {
				n++
			}
		}
		t.Fatalf("%d of %d keys misreported (e.g. done-0 %v done-1 %v done-2 %v)", n, len(keys), got[0], got[1], got[2])
	}
}
