package state

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// heldPipelines counts the pipelines on reply hashes a client sends and
// the commands in them, and
// holds the first one until release is closed.
type heldPipelines struct {
	pipes, cmds atomic.Int64
	first       chan struct{} // closed when the first pipeline is held
	release     chan struct{}
	once        sync.Once
}

func (h *heldPipelines) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if onReplies(cmd) {
			h.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *heldPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !onReplies(cmds[0]) {
			return next(ctx, cmds)
		}
		h.pipes.Add(1)
		h.cmds.Add(int64(len(cmds)))
		h.once.Do(func() {
			close(h.first)
			<-h.release
		})
		return next(ctx, cmds)
	}
}

// onReplies reports whether cmd is on a reply hash (not the lease's
// renewal, nor a new connection's handshake).
func onReplies(cmd redis.Cmder) bool {
	args := cmd.Args()
	i := 1
	if n := cmd.Name(); n == "evalsha" || n == "eval" {
		i = 3
	}
	if len(args) <= i {
		return false
	}
	k, _ := args[i].(string)
	return strings.Contains(k, ":r:")
}

// TestReplyClaimsShareRoundTrip: the claims of replies made while another
// claim's round trip is out go together in the next one (one pipeline for
// all of them, not one round trip each), and each caller still gets its
// own answer; a record is one round trip, after which the reply is found
// and its claim gone.
func TestReplyClaimsShareRoundTrip(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := newStore(t, rdb, prefix, "a", nil)
	l := acquire(t, s, "topic", 1, 5*time.Second)
	ctx := ctxT(t, 20*time.Second)
	h := &heldPipelines{first: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(h)

	const later = 8
	sendTime := time.Now().Unix()
	item := func(i int) Item { return Item{Key: fmt.Sprintf("wk:m%d:0", i), SendTime: sendTime} }
	type answer struct {
		found bool
		wait  time.Duration
		err   error
	}
	answers := make([]answer, later+1)
	var wg sync.WaitGroup
	claim := func(i int) {
		defer wg.Done()
		_, found, wait, err := l.ClaimReply(ctx, item(i), time.Second)
		answers[i] = answer{found, wait, err}
	}
	wg.Add(1)
	go claim(0)
	select { // the first claim's round trip is out
	case <-h.first:
	case <-time.After(5 * time.Second):
		close(h.release)
		wg.Wait()
		t.Fatalf("the first claim sent no pipeline (%d script calls alone)", h.cmds.Load())
	}
	wg.Add(later)
	for i := 1; i <= later; i++ {
		go claim(i)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		s.replies.mu.Lock()
		n := len(s.replies.queue)
		s.replies.mu.Unlock()
		if n == later {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims queued behind the first, want %d", n, later)
		}
		time.Sleep(time.Millisecond)
	}
	close(h.release)
	wg.Wait()
	if p, c := h.pipes.Load(), h.cmds.Load(); p != 2 || c != later+1 {
		t.Fatalf("%d claims: %d pipelines of %d commands in all; want 2 pipelines (the first claim, then the %d that waited)", later+1, p, c, later)
	}
	for i, a := range answers {
		if a.err != nil || a.found || a.wait != 0 {
			t.Fatalf("claim %d: %+v, want claimed", i, a)
		}
	}

	before := h.pipes.Load()
	if err := l.RecordClaimedReply(ctx, item(3), "fp"); err != nil {
		t.Fatal(err)
	}
	if n := h.pipes.Load() - before; n != 1 {
		t.Fatalf("a record took %d round trips, want 1", n)
	}
	if rec, found, wait, err := l.ClaimReply(ctx, item(3), time.Second); err != nil || !found || rec != "fp" || wait != 0 {
		t.Fatalf("claim after the record: (%q, %v, %s, %v), want the record", rec, found, wait, err)
	}
	k := s.replyKey(s.tag("topic", 1), sendTime)
	f := fmt.Sprint(Digest(item(3).Key))
	if ok, err := rdb.HExists(ctx, k, "c"+f).Result(); err != nil || ok {
		t.Fatalf("the recorded reply's claim field is still there (%v, %v)", ok, err)
	}
}
