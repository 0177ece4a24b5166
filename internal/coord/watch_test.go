package coord

import (
	"context"
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// change is a write made behind a watcher's back, and the event it must
// produce.
type change struct {
	typ     EventType
	key     string
	val     string
	version int64
}

// write makes the changes with the raw client (key relative to the config
// directory; val "" deletes) and records their revisions.
func write(t *testing.T, raw *clientv3.Client, ns string, cs []change) []change {
	t.Helper()
	out := make([]change, len(cs))
	for i, c := range cs {
		k := ns + dirConfig + c.key
		if c.typ == EventDelete {
			resp, err := raw.Delete(t.Context(), k)
			if err != nil || resp.Deleted != 1 {
				t.Fatalf("delete %s: %v (deleted %d)", k, err, resp.Deleted)
			}
			c.version = resp.Header.Revision
		} else {
			resp, err := raw.Put(t.Context(), k, c.val)
			if err != nil {
				t.Fatalf("put %s: %v", k, err)
			}
			c.version = resp.Header.Revision
		}
		out[i] = c
	}
	return out
}

// expect receives one event per change, in order, each matching it.
func expect(t *testing.T, ch <-chan Event[string], cs []change) {
	t.Helper()
	for _, c := range cs {
		e := recv(t, ch)
		if e.Type != c.typ || e.Key != c.key || e.Version != c.version || e.Err != nil ||
			(c.typ == EventPut && `"`+e.Value+`"` != c.val) {
			t.Fatalf("event = %v %s %q at %d (err %v), want %v %s %s at %d",
				e.Type, e.Key, e.Value, e.Version, e.Err, c.typ, c.key, c.val, c.version)
		}
	}
}

// Changes made while a watch is down arrive once each when it resumes:
// the watch resumes from the revision after the last one it delivered.
func TestWatchResumesFromLastDeliveredRevision(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	cw := interceptWatches(t, p)

	ch, err := WatchPrefix[string](t.Context(), p.Config(), "w/")
	if err != nil {
		t.Fatal(err)
	}
	if e := recv(t, ch); e.Type != EventResync || len(e.Snapshot) != 0 {
		t.Fatalf("initial event = %+v", e)
	}
	before := write(t, raw, ns, []change{{typ: EventPut, key: "w/a", val: `"1"`}})
	expect(t, ch, before)

	release := cw.cut()
	if from := cw.awaitRewatch(t); from != before[0].version+1 {
		t.Fatalf("watch resumes from revision %d, want %d (the one after the last delivered)", from, before[0].version+1)
	}
	during := write(t, raw, ns, []change{
		{typ: EventPut, key: "w/b", val: `"2"`},
		{typ: EventPut, key: "w/a", val: `"3"`},
		{typ: EventDelete, key: "w/b"},
		{typ: EventPut, key: "w/c", val: `"4"`},
	})
	release()
	expect(t, ch, during)
	// Nothing repeated: the next event is the next write.
	expect(t, ch, write(t, raw, ns, []change{{typ: EventPut, key: "w/end", val: `"5"`}}))
	if n := testenv.MetricValue(p.m.restarts); n != 1 {
		t.Fatalf("watch restarts = %v, want 1", n)
	}
}

// A watch whose resume revision was compacted away reports a Resync with
// the current values, then carries on from there.
func TestWatchCompactedRevisionResyncs(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	cw := interceptWatches(t, p)
	ctx := t.Context()

	if _, err := Set(ctx, p.Config(), "c/keep", "k"); err != nil {
		t.Fatal(err)
	}
	ch, err := WatchPrefix[string](ctx, p.Config(), "c/")
	if err != nil {
		t.Fatal(err)
	}
	if e := recv(t, ch); e.Type != EventResync || len(e.Snapshot) != 1 || e.Snapshot[0].Value != "k" {
		t.Fatalf("initial event = %+v", e)
	}
	expect(t, ch, write(t, raw, ns, []change{{typ: EventPut, key: "c/a", val: `"1"`}}))

	release := cw.cut()
	cw.awaitRewatch(t)
	during := write(t, raw, ns, []change{
		{typ: EventPut, key: "c/b", val: `"2"`},
		{typ: EventPut, key: "c/a", val: `"3"`},
		{typ: EventDelete, key: "c/keep"},
		{typ: EventPut, key: "c/d", val: `"4"`},
	})
	last := during[len(during)-1].version
	if _, err := raw.Compact(ctx, last); err != nil {
		t.Fatalf("compact: %v", err)
	}
	release()

	e := recv(t, ch)
	if e.Type != EventResync || e.Key != "c/" || e.Version < last {
		t.Fatalf("event after compaction = %v %s at %d, want a resync at >= %d", e.Type, e.Key, e.Version, last)
	}
	want := map[string]change{"c/a": during[1], "c/b": during[0], "c/d": during[3]}
	var got []string
	for _, en := range e.Snapshot {
		got = append(got, en.Key)
		w, ok := want[en.Key]
		if !ok || `"`+en.Value+`"` != w.val || en.Version != w.version || en.Err != nil {
			t.Errorf("snapshot entry %+v, want %+v", en, w)
		}
	}
	if strings.Join(got, ",") != "c/a,c/b,c/d" {
		t.Fatalf("snapshot keys = %v, want c/a,c/b,c/d", got)
	}
	if n := testenv.MetricValue(p.m.resyncs); n != 1 {
		t.Fatalf("resyncs = %v, want 1", n)
	}
	expect(t, ch, write(t, raw, ns, []change{{typ: EventPut, key: "c/end", val: `"5"`}}))
}

// Across a real network outage between the Provider and etcd, the changes
// made meanwhile (by another client) arrive once each, in order.
func TestWatchSurvivesConnectionOutage(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	target := strings.TrimPrefix(testenv.EtcdEndpoints(t)[0], "http://")
	proxy := newFaultProxy(t, target)
	p := newProvider(t, ns, func(c *Config) { c.Endpoints = []string{proxy.addr()} })

	ch, err := WatchPrefix[string](t.Context(), p.Config(), "o/")
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch) // initial resync
	expect(t, ch, write(t, raw, ns, []change{{typ: EventPut, key: "o/a", val: `"1"`}}))

	proxy.cut()
	during := write(t, raw, ns, []change{
		{typ: EventPut, key: "o/b", val: `"2"`},
		{typ: EventDelete, key: "o/a"},
		{typ: EventPut, key: "o/c", val: `"3"`},
	})
	proxy.restore()
	expect(t, ch, during)
	expect(t, ch, write(t, raw, ns, []change{{typ: EventPut, key: "o/end", val: `"4"`}}))
}

// The watch ends, closing its channel, when its context does.
func TestWatchEndsWithContext(t *testing.T) {
	_, ns := testenv.Etcd(t)
	p := newProvider(t, ns)
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := Watch[int](ctx, p.Config(), "x")
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch)
	cancel()
	awaitClosed(t, ch)
}
