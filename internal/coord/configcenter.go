package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ConfigCenter stores JSON configuration values under the config/
// directory of the namespace. Its typed operations are the generic
// functions Get, GetWithVersion, List, Set, CompareAndSet, Watch and
// WatchPrefix (Go methods cannot have type parameters).
//
// A value's version is its etcd mod revision: it grows with every write,
// CompareAndSet compares it, and 0 means the key does not exist.
type ConfigCenter struct{ p *Provider }

// EventType says what a config Event reports.
type EventType int

// Event types.
const (
	// EventPut: Key was created or changed to Value at Version.
	EventPut EventType = iota + 1
	// EventDelete: Key was deleted at revision Version.
	EventDelete
	// EventResync: Snapshot is the whole watched state at revision Version;
	// it replaces whatever the receiver knew. A watch sends one first, and
	// again whenever the revision it had to resume from was compacted away
	// (the changes in between can no longer be replayed one by one).
	EventResync
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	case EventResync:
		return "resync"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change seen by Watch or WatchPrefix.
type Event[T any] struct {
	Type EventType
	// Key is the changed key; for EventResync, the watched key or prefix.
	Key string
	// Value is the new value of an EventPut (zero when Err is set).
	Value T
	// Version is the key's new version for EventPut, the revision of the
	// deletion for EventDelete, the revision of the snapshot for
	// EventResync.
	Version int64
	// Err is set (wrapping ErrDecode) when an EventPut's value does not
	// decode into T; the event is delivered all the same.
	Err error
	// Snapshot holds, for EventResync, every watched key that exists, in
	// key order.
	Snapshot []Entry[T]
}

// Entry is one key's value, as listed by List or carried by a resync.
type Entry[T any] struct {
	Key     string
	Value   T
	Version int64
	// Err is set (wrapping ErrDecode) when the value does not decode into
	// T; Value is then zero.
	Err error
}

func configKey(key string) (string, error) {
	if key == "" {
		return "", errors.New("coord: config key must not be empty")
	}
	return dirConfig + key, nil
}

func decode[T any](kv *mvccpb.KeyValue) Entry[T] {
	e := Entry[T]{Key: strings.TrimPrefix(string(kv.Key), dirConfig), Version: kv.ModRevision}
	if err := json.Unmarshal(kv.Value, &e.Value); err != nil {
		var zero T
		e.Value = zero
		e.Err = fmt.Errorf("%w: %q at version %d as %T: %v", ErrDecode, e.Key, e.Version, zero, err)
	}
	return e
}

func encode[T any](key string, v T) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("coord: encode %q: %w", key, err)
	}
	return string(b), nil
}

// Get returns the value of key; ErrNotFound when it does not exist.
func Get[T any](ctx context.Context, cc *ConfigCenter, key string) (T, error) {
	v, _, err := GetWithVersion[T](ctx, cc, key)
	return v, err
}

// GetWithVersion returns the value of key and its version, for a later
// CompareAndSet; ErrNotFound when the key does not exist.
func GetWithVersion[T any](ctx context.Context, cc *ConfigCenter, key string) (T, int64, error) {
	var zero T
	k, err := configKey(key)
	if err != nil {
		return zero, 0, err
	}
	resp, err := cc.p.cli.Get(ctx, k)
	if err != nil {
		return zero, 0, fmt.Errorf("coord: get %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return zero, 0, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	e := decode[T](resp.Kvs[0])
	return e.Value, e.Version, e.Err
}

// List returns every key under prefix ("" for all) in key order. A value
// that does not decode is still listed, with Err set.
func List[T any](ctx context.Context, cc *ConfigCenter, prefix string) ([]Entry[T], error) {
	_, kvs, err := cc.p.load(ctx, dirConfig+prefix, true)
	if err != nil {
		return nil, fmt.Errorf("coord: list: %w", err)
	}
	return decodeAll[T](kvs), nil
}

func decodeAll[T any](kvs []*mvccpb.KeyValue) []Entry[T] {
	out := make([]Entry[T], len(kvs))
	for i, kv := range kvs {
		out[i] = decode[T](kv)
	}
	return out
}

// Set writes v as JSON to key and returns its new version.
func Set[T any](ctx context.Context, cc *ConfigCenter, key string, v T) (int64, error) {
	k, err := configKey(key)
	if err != nil {
		return 0, err
	}
	val, err := encode(key, v)
	if err != nil {
		return 0, err
	}
	resp, err := cc.p.cli.Put(ctx, k, val)
	if err != nil {
		return 0, fmt.Errorf("coord: set %q: %w", key, err)
	}
	return resp.Header.Revision, nil
}

// CompareAndSet writes v to key only if the key's version is still version
// (0: only if the key does not exist) and returns the new version. On a
// mismatch nothing is written and the error is a *VersionConflictError
// (errors.Is ErrVersionConflict) carrying the current version.
func CompareAndSet[T any](ctx context.Context, cc *ConfigCenter, key string, v T, version int64) (int64, error) {
	k, err := configKey(key)
	if err != nil {
		return 0, err
	}
	if version < 0 {
		return 0, fmt.Errorf("coord: compare-and-set %q: version must be >= 0, got %d", key, version)
	}
	val, err := encode(key, v)
	if err != nil {
		return 0, err
	}
	resp, err := cc.p.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", version)).
		Then(clientv3.OpPut(k, val)).
		Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("coord: compare-and-set %q: %w", key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	conflict := &VersionConflictError{Key: key, Expected: version}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		conflict.Current = kvs[0].ModRevision
	}
	return 0, conflict
}

// Delete deletes key; deleting a missing key is not an error.
func (cc *ConfigCenter) Delete(ctx context.Context, key string) error {
	k, err := configKey(key)
	if err != nil {
		return err
	}
	if _, err := cc.p.cli.Delete(ctx, k); err != nil {
		return fmt.Errorf("coord: delete %q: %w", key, err)
	}
	return nil
}

// Watch reports the changes of key. The first event is an EventResync with
// the current value (an empty Snapshot if the key does not exist); then
// every EventPut and EventDelete in order, each once, across disconnects
// and leader changes. The channel is closed when ctx ends or the Provider
// closes; the receiver must keep reading until then.
func Watch[T any](ctx context.Context, cc *ConfigCenter, key string) (<-chan Event[T], error) {
	k, err := configKey(key)
	if err != nil {
		return nil, err
	}
	return watchConfig[T](ctx, cc.p, k, false)
}

// WatchPrefix is Watch for every key under prefix ("" for all), including
// keys created after the watch started.
func WatchPrefix[T any](ctx context.Context, cc *ConfigCenter, prefix string) (<-chan Event[T], error) {
	return watchConfig[T](ctx, cc.p, dirConfig+prefix, true)
}

func watchConfig[T any](ctx context.Context, p *Provider, key string, prefix bool) (<-chan Event[T], error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	rev, kvs, err := p.load(ctx, key, prefix)
	if err != nil {
		return nil, fmt.Errorf("coord: watch: %w", err)
	}
	name := strings.TrimPrefix(key, dirConfig)
	resync := func(rev int64, kvs []*mvccpb.KeyValue) Event[T] {
		return Event[T]{Type: EventResync, Key: name, Version: rev, Snapshot: decodeAll[T](kvs)}
	}
	out := make(chan Event[T]) // unbuffered: etcd's watch buffers while the receiver is busy
	wctx, cancel := p.bind(ctx)
	f := follower{
		events: func(ctx context.Context, evs []*clientv3.Event) bool {
			for _, ev := range evs {
				var e Event[T]
				if ev.Type == mvccpb.DELETE {
					e = Event[T]{Type: EventDelete, Key: strings.TrimPrefix(string(ev.Kv.Key), dirConfig), Version: ev.Kv.ModRevision}
				} else {
					d := decode[T](ev.Kv)
					e = Event[T]{Type: EventPut, Key: d.Key, Value: d.Value, Version: d.Version, Err: d.Err}
				}
				if !send(ctx, out, e) {
					return false
				}
			}
			return true
		},
		snapshot: func(ctx context.Context, rev int64, kvs []*mvccpb.KeyValue) bool {
			return send(ctx, out, resync(rev, kvs))
		},
	}
	err = p.spawn(func() {
		defer close(out)
		defer cancel()
		if f.snapshot(wctx, rev, kvs) {
			p.follow(wctx, key, prefix, rev, f)
		}
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return out, nil
}
