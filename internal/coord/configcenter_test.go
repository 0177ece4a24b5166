package coord

import (
	"errors"
	"sync"
	"testing"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

type rule struct {
	Max    int    `json:"max"`
	Window string `json:"window"`
}

func TestConfigSetGetListDelete(t *testing.T) {
	_, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	cc, ctx := p.Config(), t.Context()

	if _, err := Get[rule](ctx, cc, "rules/vip"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	v1, err := Set(ctx, cc, "rules/vip", rule{Max: 100, Window: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Set(ctx, cc, "rules/normal", rule{Max: 10, Window: "1m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Set(ctx, cc, "other", rule{}); err != nil {
		t.Fatal(err)
	}
	got, ver, err := GetWithVersion[rule](ctx, cc, "rules/vip")
	if err != nil || got != (rule{Max: 100, Window: "1m"}) || ver != v1 {
		t.Fatalf("GetWithVersion = %+v, %d, %v; want {100 1m}, %d", got, ver, err, v1)
	}
	list, err := List[rule](ctx, cc, "rules/")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Key != "rules/normal" || list[0].Value.Max != 10 ||
		list[1].Key != "rules/vip" || list[1].Version != v1 {
		t.Fatalf("List = %+v", list)
	}
	if err := cc.Delete(ctx, "rules/vip"); err != nil {
		t.Fatal(err)
	}
	if _, err := Get[rule](ctx, cc, "rules/vip"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
}

func TestCompareAndSetConflictCarriesCurrentVersion(t *testing.T) {
	_, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	cc, ctx := p.Config(), t.Context()

	v1, err := CompareAndSet(ctx, cc, "n", 1, 0) // 0: create only
	if err != nil {
		t.Fatalf("create with version 0: %v", err)
	}
	v2, err := CompareAndSet(ctx, cc, "n", 2, v1)
	if err != nil || v2 <= v1 {
		t.Fatalf("CompareAndSet at the current version: %d, %v", v2, err)
	}
	for _, stale := range []int64{v1, 0} {
		_, err = CompareAndSet(ctx, cc, "n", 3, stale)
		var conflict *VersionConflictError
		if !errors.Is(err, ErrVersionConflict) || !errors.As(err, &conflict) {
			t.Fatalf("CompareAndSet at stale version %d: %v, want ErrVersionConflict", stale, err)
		}
		if conflict.Current != v2 || conflict.Expected != stale || conflict.Key != "n" {
			t.Fatalf("conflict = %+v, want current %d", conflict, v2)
		}
	}
	if got, _ := Get[int](ctx, cc, "n"); got != 2 {
		t.Fatalf("value after rejected writes = %d, want 2", got)
	}

	// Read-modify-write loops from two Providers lose no increment.
	q := newProvider(t, ns)
	const perWorker, workers = 10, 4
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := []*Provider{p, q}[w%2].Config()
			for range perWorker {
				for {
					n, ver, err := GetWithVersion[int](ctx, c, "n")
					if err != nil {
						errc <- err
						return
					}
					if _, err = CompareAndSet(ctx, c, "n", n+1, ver); err == nil {
						break
					} else if !errors.Is(err, ErrVersionConflict) {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if got, _ := Get[int](ctx, cc, "n"); got != 2+perWorker*workers {
		t.Fatalf("counter = %d, want %d", got, 2+perWorker*workers)
	}
}

// A value that does not decode still produces its event (and list entry),
// with Err set, so no change goes unnoticed.
func TestWatchDecodeFailureYieldsEventWithErr(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	cc, ctx := p.Config(), t.Context()

	if _, err := raw.Put(ctx, ns+dirConfig+"r/bad", "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := Get[rule](ctx, cc, "r/bad"); !errors.Is(err, ErrDecode) {
		t.Fatalf("Get of a bad value: %v, want ErrDecode", err)
	}
	ch, err := WatchPrefix[rule](ctx, cc, "r/")
	if err != nil {
		t.Fatal(err)
	}
	first := recv(t, ch)
	if first.Type != EventResync || len(first.Snapshot) != 1 || !errors.Is(first.Snapshot[0].Err, ErrDecode) {
		t.Fatalf("initial event = %+v, want a resync with one undecodable entry", first)
	}
	one, err := Watch[rule](ctx, cc, "r/x")
	if err != nil {
		t.Fatal(err)
	}
	if e := recv(t, one); e.Type != EventResync || len(e.Snapshot) != 0 {
		t.Fatalf("initial event of a missing key = %+v", e)
	}

	resp, err := raw.Put(ctx, ns+dirConfig+"r/x", `{"max":"many"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []<-chan Event[rule]{ch, one} {
		e := recv(t, c)
		if e.Type != EventPut || e.Key != "r/x" || e.Version != resp.Header.Revision ||
			!errors.Is(e.Err, ErrDecode) || e.Value != (rule{}) {
			t.Fatalf("event of an undecodable put = %+v, want put r/x at %d with ErrDecode", e, resp.Header.Revision)
		}
	}
	v, err := Set(ctx, cc, "r/x", rule{Max: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []<-chan Event[rule]{ch, one} {
		if e := recv(t, c); e.Type != EventPut || e.Err != nil || e.Value.Max != 5 || e.Version != v {
			t.Fatalf("event of a good put = %+v", e)
		}
	}
	if err := cc.Delete(ctx, "r/x"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []<-chan Event[rule]{ch, one} {
		if e := recv(t, c); e.Type != EventDelete || e.Key != "r/x" || e.Version <= v {
			t.Fatalf("event of a delete = %+v", e)
		}
	}
}
