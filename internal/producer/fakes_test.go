package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// memStore is the shared "Redis" of the unit-test fakes: cursors, pending
// flags and the lock table, under one mutex so fencing is exact.
type memStore struct {
	mu      sync.Mutex
	cursors map[string]string
	pending map[string]bool
	locks   map[string]*fakeMutex
	// writes records every cursor write in order.
	writes []string
}

func newMemStore() *memStore {
	return &memStore{cursors: map[string]string{}, pending: map[string]bool{}, locks: map[string]*fakeMutex{}}
}

func (m *memStore) CursorKey(kf string) string { return "cursor:" + kf }

func (m *memStore) Cursor(_ context.Context, kf string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursors[m.CursorKey(kf)], nil
}

func (m *memStore) MarkPending(_ context.Context, kf string, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending[kf] = true
	return nil
}

func (m *memStore) TakePending(_ context.Context, kf string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := m.pending[kf]
	delete(m.pending, kf)
	return was, nil
}

func (m *memStore) HasPending(_ context.Context, kf string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending[kf], nil
}

func (m *memStore) cursor(kf string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursors[m.CursorKey(kf)]
}

// fakeLocker is a Locker on memStore. busyFor makes the next n TryLock
// calls on any name report busy regardless of the table.
type fakeLocker struct {
	s       *memStore
	busyFor atomic.Int32
	tries   atomic.Int32
}

type fakeMutex struct {
	s    *memStore
	name string
	lost chan struct{}
	once sync.Once
}

func (l *fakeLocker) TryLock(_ context.Context, name string, _ time.Duration) (Mutex, error) {
	l.tries.Add(1)
	if l.busyFor.Add(-1) >= 0 {
		return nil, fmt.Errorf("fake: %w", ErrLockBusy)
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.locks[name] != nil {
		return nil, fmt.Errorf("fake: %w", ErrLockBusy)
	}
	m := &fakeMutex{s: l.s, name: name, lost: make(chan struct{})}
	l.s.locks[name] = m
	return m, nil
}

func (l *fakeLocker) held(name string) bool {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.locks[name] != nil
}

func (m *fakeMutex) Lost() <-chan struct{} { return m.lost }

// lose simulates an expired lock: it is removed from the table and Lost
// fires.
func (m *fakeMutex) lose() {
	m.s.mu.Lock()
	if m.s.locks[m.name] == m {
		delete(m.s.locks, m.name)
	}
	m.s.mu.Unlock()
	m.once.Do(func() { close(m.lost) })
}

func (m *fakeMutex) Unlock(context.Context) error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if m.s.locks[m.name] != m {
		return ErrNotHeld
	}
	delete(m.s.locks, m.name)
	return nil
}

func (m *fakeMutex) SetIfHeld(_ context.Context, key, value string, _ time.Duration) error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if m.s.locks[m.name] != m {
		return ErrNotHeld
	}
	m.s.cursors[key] = value
	m.s.writes = append(m.s.writes, value)
	return nil
}

// pageSource serves a fixed chain of pages per open_kfid: the page for
// cursor c is pages[kf][c]. hook, when set, runs first and may return an
// error or block.
type pageSource struct {
	mu    sync.Mutex
	pages map[string]map[string]SyncResponse
	reqs  []SyncRequest
	hook  func(req SyncRequest) error
}

func (p *pageSource) set(kf, cursor string, r SyncResponse) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pages == nil {
		p.pages = map[string]map[string]SyncResponse{}
	}
	if p.pages[kf] == nil {
		p.pages[kf] = map[string]SyncResponse{}
	}
	p.pages[kf][cursor] = r
}

func (p *pageSource) SyncMsg(ctx context.Context, req SyncRequest) (*SyncResponse, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	hook := p.hook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(req); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pages[req.OpenKfID][req.Cursor]
	if !ok { // caught up: nothing new, cursor stays
		return &SyncResponse{NextCursor: req.Cursor}, nil
	}
	// New records on every call, as the wecom client returns them.
	r.MsgList = slices.Clone(r.MsgList)
	for i, m := range r.MsgList {
		c := *m
		r.MsgList[i] = &c
	}
	return &r, nil
}

func (p *pageSource) requests() []SyncRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]SyncRequest(nil), p.reqs...)
}

// msgs builds n upstream messages named prefix-0…
func msgs(kf, prefix string, n int) []*chatmsg.ChatMessage {
	out := make([]*chatmsg.ChatMessage, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		out[i] = &chatmsg.ChatMessage{UpstreamMsgID: id, OpenKfID: kf, ExternalUserID: "u-" + id, MsgType: "text",
			SendTime: int64(1700000000 + i), Content: json.RawMessage(`{"msgid":"` + id + `"}`)}
	}
	return out
}

// recPublisher records acknowledged batches; fail, when set, decides per
// call whether the batch fails.
type recPublisher struct {
	mu    sync.Mutex
	got   []string // upstream msgids in produce order
	calls int
	fail  func(call int) error
}

func (r *recPublisher) ProduceBatch(ctx context.Context, _ string, ms []*chatmsg.ChatMessage) error {
	r.mu.Lock()
	r.calls++
	call, fail := r.calls, r.fail
	r.mu.Unlock()
	if fail != nil {
		if err := fail(call); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		r.got = append(r.got, m.UpstreamMsgID)
	}
	return ctx.Err()
}

func (r *recPublisher) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

type seqIDs struct{ n atomic.Int64 }

func (s *seqIDs) Next() (int64, error) { return s.n.Add(1), nil }

// codeErr is an error carrying a WeChat errcode the way a client may.
type codeErr int

func (c codeErr) Error() string { return fmt.Sprintf("errcode %d", int(c)) }
func (c codeErr) ErrCode() int  { return int(c) }
