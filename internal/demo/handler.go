package demo

import (
	"context"
	"errors"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/kf"
)

// errOutage is what the business handler answers while the scripted
// downstream outage lasts.
var errOutage = errors.New("downstream unavailable (scripted outage)")

// errFailing is what the business handler answers, while the scripted
// failure lasts, for the users whose downstream fails.
var errFailing = errors.New("downstream failing for this user (scripted)")

// errAfterReply is what the handler answers, once, for one message in
// crashEvery after its reply went out: as if it had crashed or timed out
// there. The retry runs the handler again; its reply is not sent twice.
var errAfterReply = errors.New("failed after replying (scripted)")

// crashEvery picks those messages by their msgid.
const crashEvery = 20

// replyText is the demo handler's answer to every message.
const replyText = "Thanks, we got your message."

// warmupUser's message proves the whole path works before the scenario
// starts; it is not counted.
const warmupUser = "demo-warmup"

// recorder is the demo's business Handler: it replies to the customer
// (kfpipe.Reply: once per message however often it runs), records, per
// user, the upstream msgids it handled in the order it handled them, fails
// everything while an outage is on and the failing users' messages while
// their downstream fails. A reply WeChat refuses for good
// (the 5-in-48h window) is counted and the message finished: the business
// decided that an unanswered message is not worth a dead letter.
type recorder struct {
	outage  atomic.Bool
	failing atomic.Bool
	warm    chan struct{}
	once    sync.Once
	// photoDone is closed when the photo was handled (photo says how).
	photoDone chan struct{}
	photoOnce sync.Once
	photo     photoSeen

	mu       sync.Mutex
	seqs     map[string][]string // user → msgids, first successful handling only
	handled  map[string]int      // msgid → successful handlings (> 1 is a double effect)
	latency  map[string]time.Duration
	failures int             // handler calls failed by the outage
	failed   int             // handler calls failed by the failing downstream
	replayed map[string]bool // msgids failed once after their reply
	refused  int             // replies WeChat refused for good
	last     time.Time
	perSec   map[int64]int // unix second → handled
	// handledAt and producedAt are each message's first successful
	// handling and its produced_at.
	handledAt, producedAt map[string]time.Time
	userOf                map[string]string // msgid → user
	// The outage lasts from outageAt until the first success after
	// outageEndAt (the gate closes on it): outageClosedAt. fixedAt is
	// when the failing downstream was fixed.
	outageAt, outageEndAt, outageClosedAt time.Time
	failAt, fixedAt                       time.Time
}

func newRecorder() *recorder {
	return &recorder{warm: make(chan struct{}), photoDone: make(chan struct{}), seqs: map[string][]string{}, handled: map[string]int{},
		latency: map[string]time.Duration{}, perSec: map[int64]int{}, replayed: map[string]bool{},
		handledAt: map[string]time.Time{}, producedAt: map[string]time.Time{}, userOf: map[string]string{}}
}

func (r *recorder) outageOn() {
	r.mu.Lock()
	r.outageAt = time.Now()
	r.mu.Unlock()
	r.outage.Store(true)
}

func (r *recorder) outageOff() {
	r.mu.Lock()
	r.outageEndAt = time.Now()
	r.mu.Unlock()
	r.outage.Store(false)
}

func (r *recorder) failOn() {
	r.mu.Lock()
	r.failAt = time.Now()
	r.mu.Unlock()
	r.failing.Store(true)
}

func (r *recorder) failOff() {
	r.mu.Lock()
	r.fixedAt = time.Now()
	r.mu.Unlock()
	r.failing.Store(false)
}

// Handle implements consumer.Handler.
func (r *recorder) Handle(ctx context.Context, m *chatmsg.ChatMessage) error {
	if m.ExternalUserID == warmupUser {
		r.once.Do(func() { close(r.warm) })
		return nil
	}
	if m.ExternalUserID == photoUser {
		return r.handlePhoto(ctx, m)
	}
	if r.outage.Load() {
		r.mu.Lock()
		r.failures++
		r.mu.Unlock()
		return errOutage
	}
	if r.failing.Load() && profileOf(m.ExternalUserID) == "failing" {
		r.mu.Lock()
		r.failed++
		r.mu.Unlock()
		return errFailing
	}
	err := kfpipe.Reply(ctx, kf.Text{Content: replyText})
	switch {
	case kfpipe.IsPermanent(err):
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
	case err != nil:
		return err
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if crc32.ChecksumIEEE([]byte(m.UpstreamMsgID))%crashEvery == 0 && !r.replayed[m.UpstreamMsgID] {
		r.replayed[m.UpstreamMsgID] = true
		return errAfterReply
	}
	if !r.outageEndAt.IsZero() && r.outageClosedAt.IsZero() {
		r.outageClosedAt = now
	}
	r.handled[m.UpstreamMsgID]++
	if r.handled[m.UpstreamMsgID] == 1 {
		r.seqs[m.ExternalUserID] = append(r.seqs[m.ExternalUserID], m.UpstreamMsgID)
		r.handledAt[m.UpstreamMsgID] = now
		r.userOf[m.UpstreamMsgID] = m.ExternalUserID
		if m.ProducedAt > 0 {
			r.producedAt[m.UpstreamMsgID] = time.UnixMilli(m.ProducedAt)
			r.latency[m.UpstreamMsgID] = now.Sub(time.UnixMilli(m.ProducedAt))
		}
	}
	r.last = now
	r.perSec[now.Unix()]++
	return nil
}

// processed returns how many distinct messages were handled.
func (r *recorder) processed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handled)
}

// recorded is a copy of what the recorder saw.
type recorded struct {
	seqs     map[string][]string
	handled  map[string]int
	latency  map[string]time.Duration
	failures int
	failed   int
	replayed int
	refused  int
	last     time.Time
	peak     int // most messages handled within one wall-clock second

	outageAt, outageEndAt, outageClosedAt time.Time
	failAt, fixedAt                       time.Time
	handledAt, producedAt                 map[string]time.Time
	userOf                                map[string]string
}

func (r *recorder) snapshot() recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := recorded{seqs: make(map[string][]string, len(r.seqs)), handled: make(map[string]int, len(r.handled)),
		latency: make(map[string]time.Duration, len(r.latency)), failures: r.failures, last: r.last,
		replayed: len(r.replayed), refused: r.refused, failed: r.failed,
		outageAt: r.outageAt, outageEndAt: r.outageEndAt, outageClosedAt: r.outageClosedAt,
		failAt: r.failAt, fixedAt: r.fixedAt,
		handledAt: make(map[string]time.Time, len(r.handledAt)), producedAt: make(map[string]time.Time, len(r.producedAt))}
	for k, v := range r.handledAt {
		out.handledAt[k] = v
	}
	for k, v := range r.producedAt {
		out.producedAt[k] = v
	}
	out.userOf = make(map[string]string, len(r.userOf))
	for k, v := range r.userOf {
		out.userOf[k] = v
	}
	for u, s := range r.seqs {
		out.seqs[u] = append([]string(nil), s...)
	}
	for k, v := range r.handled {
		out.handled[k] = v
	}
	for k, v := range r.latency {
		out.latency[k] = v
	}
	for _, n := range r.perSec {
		out.peak = max(out.peak, n)
	}
	return out
}
