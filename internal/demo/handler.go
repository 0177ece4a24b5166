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
// user, the upstream msgids it handled in the order it handled them, and
// fails everything while an outage is on. A reply WeChat refuses for good
// (the 5-in-48h window) is counted and the message finished: the business
// decided that an unanswered message is not worth a dead letter.
type recorder struct {
	outage atomic.Bool
	warm   chan struct{}
	once   sync.Once

	mu       sync.Mutex
	seqs     map[string][]string // user → msgids, first successful handling only
	handled  map[string]int      // msgid → successful handlings (> 1 is a double effect)
	latency  map[string]time.Duration
	failures int
	replayed map[string]bool // msgids failed once after their reply
	refused  int             // replies WeChat refused for good
	last     time.Time
	perSec   map[int64]int // unix second → handled
}

func newRecorder() *recorder {
	return &recorder{warm: make(chan struct{}), seqs: map[string][]string{}, handled: map[string]int{},
		latency: map[string]time.Duration{}, perSec: map[int64]int{}, replayed: map[string]bool{}}
}

// Handle implements consumer.Handler.
func (r *recorder) Handle(ctx context.Context, m *chatmsg.ChatMessage) error {
	if m.ExternalUserID == warmupUser {
		r.once.Do(func() { close(r.warm) })
		return nil
	}
	if r.outage.Load() {
		r.mu.Lock()
		r.failures++
		r.mu.Unlock()
		return errOutage
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
	r.handled[m.UpstreamMsgID]++
	if r.handled[m.UpstreamMsgID] == 1 {
		r.seqs[m.ExternalUserID] = append(r.seqs[m.ExternalUserID], m.UpstreamMsgID)
		if m.ProducedAt > 0 {
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
	replayed int
	refused  int
	last     time.Time
	peak     int // most messages handled within one wall-clock second
}

func (r *recorder) snapshot() recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := recorded{seqs: make(map[string][]string, len(r.seqs)), handled: make(map[string]int, len(r.handled)),
		latency: make(map[string]time.Duration, len(r.latency)), failures: r.failures, last: r.last,
		replayed: len(r.replayed), refused: r.refused}
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
